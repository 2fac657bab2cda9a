import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { CodeContextWire, CodeLanguage } from '../../protocol/wire.js';
import { NotFoundError, ToolUnavailableError, toolUnavailable } from '../../server/errors.js';
import type { ProcessTable } from '../../server/process-table.js';
import { which } from '../../server/which.js';
import { DriverInterpreter } from './driver-interpreter.js';
import type { Interpreter } from './interpreter.js';
import { BASH_ARGS, ShellInterpreter } from './shell-interpreter.js';

/** Where envd finds its drivers: next to itself (`/opt/abx` in a sandbox). */
export interface DriverFiles {
  /** Holds `python_driver.py` and `js_driver.cjs`. */
  driversDir: string;
}

/** One code context: a language, a working directory and its interpreter. */
export interface CodeContext {
  id: string;
  language: CodeLanguage;
  cwd: string;
  interpreter: Interpreter;
}

export function contextView(context: CodeContext): CodeContextWire {
  const { id, language, cwd, interpreter } = context;
  return { id, language, cwd, alive: interpreter.dead === undefined };
}

/**
 * The code contexts of one server. Interpreters are started in the server's process table, so
 * `GET /process` shows them and the server's stop kills them with everything else it started.
 */
export class CodeContexts {
  private readonly contexts = new Map<string, CodeContext>();
  /** The context each language's execute without `context_id` uses, made on first use. */
  private readonly defaults = new Map<CodeLanguage, Promise<CodeContext>>();
  private nextId = 1;

  constructor(
    private readonly processes: ProcessTable,
    private readonly files: DriverFiles,
  ) {}

  async create(language: CodeLanguage, cwd: string): Promise<CodeContext> {
    const id = `ctx${this.nextId++}`;
    const context = { id, language, cwd, interpreter: await this.spawn(id, language, cwd) };
    this.contexts.set(id, context);
    return context;
  }

  get(id: string): CodeContext {
    const context = this.contexts.get(id);
    if (!context) {
      throw new NotFoundError(
        `no code context with id '${id}'; known: ${[...this.contexts.keys()].join(', ') || '(none)'}`,
      );
    }
    return context;
  }

  list(): CodeContext[] {
    return [...this.contexts.values()];
  }

  /** The default context of a language; a dead one stays (restart it) so state is never lost silently. */
  byLanguage(language: CodeLanguage, cwd: string): Promise<CodeContext> {
    let pending = this.defaults.get(language);
    if (!pending) {
      pending = this.create(language, cwd);
      pending.catch(() => this.defaults.delete(language));
      this.defaults.set(language, pending);
    }
    return pending;
  }

  remove(id: string): void {
    const context = this.get(id);
    context.interpreter.kill();
    this.contexts.delete(id);
    for (const [language, pending] of this.defaults) {
      void pending.then((c) => c === context && this.defaults.delete(language));
    }
  }

  /** A new interpreter for the context (same id, language and cwd); the old one is killed. */
  async restart(id: string): Promise<CodeContext> {
    const context = this.get(id);
    context.interpreter.kill();
    context.interpreter = await this.spawn(id, context.language, context.cwd);
    return context;
  }

  private async spawn(id: string, language: CodeLanguage, cwd: string): Promise<Interpreter> {
    const [file, args] = await this.program(language);
    const entry = await this.processes.start(file, args, {
      command: `${[file, ...args].join(' ')} (code context ${id})`,
      cwd,
      env: { MPLBACKEND: 'Agg', PYTHONUNBUFFERED: '1', PYTHONIOENCODING: 'utf-8' },
    });
    const interpreter =
      language === 'bash'
        ? new ShellInterpreter(language, entry)
        : new DriverInterpreter(language, entry);
    interpreter.start();
    return interpreter;
  }

  private async program(language: CodeLanguage): Promise<[string, string[]]> {
    if (language === 'bash') {
      const bash = await which('bash');
      if (bash) return [bash, BASH_ARGS];
      const sh = await which('sh');
      if (sh) return [sh, []];
      throw toolUnavailable('bash', 'running shell code');
    }
    const driver = join(
      this.files.driversDir,
      language === 'python' ? 'python_driver.py' : 'js_driver.cjs',
    );
    if (!existsSync(driver)) {
      throw new ToolUnavailableError(
        `envd's ${language} driver ${driver} is missing; the sandbox runtime is incomplete (rebuild the package)`,
      );
    }
    if (language === 'javascript') return [process.execPath, [driver]];
    const python = await which('python3');
    if (!python) throw toolUnavailable('python3', 'running Python code');
    return [python, ['-u', driver]];
  }
}
