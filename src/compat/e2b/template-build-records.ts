/**
 * The records of E2B template builds (template-build-routes.ts), kept on disk so a build's status
 * and log lines outlive the daemon: one JSON file per build (`<dir>/<buildID>.json`, written to a
 * temporary file and renamed, so a crash leaves the old record or the new one, never half of
 * one), the newest MAX_BUILDS kept. A build that was running when its daemon stopped is read back
 * as failed, saying so: nothing resumes it.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** Builds kept for status polling (in memory and on disk); the oldest finished ones go first. */
export const MAX_BUILDS = 200;
/** Log lines kept per build; later lines are dropped, saying so once. */
export const MAX_LOG_LINES = 10_000;
/** Characters of log text kept per build (so MAX_BUILDS records stay small on disk). */
export const MAX_LOG_CHARS = 1024 ** 2;
/** The longest message one log line keeps. */
const MAX_LINE_CHARS = 4000;
/** How often a running build's record is written while lines arrive. */
export const BUILD_RECORD_FLUSH_MS = 2000;

export interface BuildLogEntry {
  timestamp: string;
  level: 'debug' | 'info' | 'warn' | 'error';
  message: string;
  step?: string;
}

/** One build as the routes keep it and as its file holds it. */
export interface BuildRecord {
  id: string;
  template: string;
  /** The key that requested it (null: the daemon's own key). */
  owner: string | null;
  status: 'waiting' | 'building' | 'ready' | 'error';
  resources: { cpu?: number; memory?: string };
  logs: BuildLogEntry[];
  /** Characters of `logs`' messages, for MAX_LOG_CHARS. */
  logChars: number;
  /** The log is full: its last line says so, and no later line is kept. */
  logFull?: boolean;
  reason?: { message: string; step?: string };
  createdAt: number;
}

/** What a build that was running when the daemon stopped reads as after the restart. */
export const INTERRUPTED =
  'the daemon stopped while this template was building, so the build did not finish (the template keeps its previous build, if it had one): build it again';

const ID = /^[0-9a-f-]{36}$/;

/**
 * Adds a line to `build`'s log, unless its log is full: the first line past MAX_LOG_LINES or
 * MAX_LOG_CHARS says that later lines are not kept, and is the last.
 */
export function appendLog(
  build: BuildRecord,
  message: string,
  level: BuildLogEntry['level'] = 'info',
  step?: number,
  now = new Date(),
): void {
  if (build.logFull) return;
  let text = message.length > MAX_LINE_CHARS ? `${message.slice(0, MAX_LINE_CHARS)}…` : message;
  if (build.logs.length >= MAX_LOG_LINES || build.logChars + text.length > MAX_LOG_CHARS) {
    text = `(the build log is full: ${MAX_LOG_LINES} lines or ${MAX_LOG_CHARS} characters at most; later lines are not kept)`;
    build.logFull = true;
  }
  build.logChars += text.length;
  build.logs.push({
    timestamp: now.toISOString(),
    level,
    message: text,
    ...(step === undefined ? {} : { step: String(step) }),
  });
}

function isRecord(value: unknown): value is BuildRecord {
  const r = value as BuildRecord;
  return (
    typeof r === 'object' &&
    r !== null &&
    typeof r.id === 'string' &&
    ID.test(r.id) &&
    typeof r.template === 'string' &&
    (r.owner === null || typeof r.owner === 'string') &&
    ['waiting', 'building', 'ready', 'error'].includes(r.status) &&
    Array.isArray(r.logs) &&
    typeof r.createdAt === 'number'
  );
}

/** The build records of one daemon home: a folder of JSON files. */
export class BuildRecords {
  constructor(
    private readonly dir: string,
    private readonly max = MAX_BUILDS,
  ) {}

  private file(id: string): string {
    if (!ID.test(id)) throw new Error(`not a build id: ${id}`);
    return join(this.dir, `${id}.json`);
  }

  /** Writes `build`'s record, replacing the previous one whole. */
  save(build: BuildRecord): void {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const file = this.file(build.id);
    const temp = `${file}.${randomBytes(6).toString('hex')}.tmp`;
    try {
      writeFileSync(temp, JSON.stringify(build), { mode: 0o600 });
      renameSync(temp, file);
    } finally {
      rmSync(temp, { force: true });
    }
  }

  remove(id: string): void {
    rmSync(this.file(id), { force: true });
  }

  /**
   * Every record, oldest first (the newest `max`; older ones are removed). A build that was
   * waiting or running is the last daemon's, stopped: it is rewritten as failed, and
   * `interrupted` is told its id (to clear what it left). Unreadable files and temporary files a
   * crash left are removed.
   */
  load(interrupted: (id: string) => void = () => undefined): BuildRecord[] {
    let names: string[];
    try {
      names = readdirSync(this.dir);
    } catch {
      return [];
    }
    const records: BuildRecord[] = [];
    for (const name of names) {
      const path = join(this.dir, name);
      let record: unknown;
      try {
        record = name.endsWith('.json') ? JSON.parse(readFileSync(path, 'utf8')) : undefined;
      } catch {
        record = undefined;
      }
      if (!isRecord(record) || name !== `${record.id}.json`) {
        rmSync(path, { recursive: true, force: true });
        continue;
      }
      record.logChars ??= record.logs.reduce((n, e) => n + String(e.message).length, 0);
      records.push(record);
    }
    records.sort((a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : 1));
    for (const old of records.splice(0, Math.max(0, records.length - this.max))) {
      this.remove(old.id);
    }
    for (const record of records) {
      if (record.status !== 'building') continue;
      appendLog(record, INTERRUPTED, 'error');
      record.status = 'error';
      record.reason = { message: INTERRUPTED };
      this.save(record);
      interrupted(record.id);
    }
    return records;
  }
}
