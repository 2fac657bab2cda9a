import { StringDecoder } from 'node:string_decoder';
import type { CodeEvent } from '../../protocol/wire.js';
import { type Execution, Interpreter } from './interpreter.js';

/**
 * An interpreter run by one of envd's drivers (python_driver.py, js_driver.cjs): requests as JSON
 * lines on its stdin, events as JSON lines on its stdout, in the order the driver wrote them. A
 * line that is not an event (something wrote to the channel behind the driver's back) is passed
 * on as stdout text.
 */
export class DriverInterpreter extends Interpreter {
  private pending = '';

  override start(): void {
    // Decoded here: the process table's logs read the same streams as Buffers.
    const decoder = new StringDecoder('utf8');
    this.entry.child.stdout?.on('data', (chunk: Buffer) => {
      const lines = (this.pending + decoder.write(chunk)).split('\n');
      this.pending = lines.pop() ?? '';
      for (const line of lines) this.line(line);
    });
    // The driver's own failures (a crash before it took over its streams) reach the cell.
    const errors = new StringDecoder('utf8');
    this.entry.child.stderr?.on('data', (chunk: Buffer) => {
      this.running?.events.push({ type: 'stderr', text: errors.write(chunk) });
    });
  }

  protected override send(execution: Execution, count: number): void {
    const request = { code: execution.code, env: execution.env, execution_count: count };
    this.entry.child.stdin?.write(`${JSON.stringify(request)}\n`);
  }

  private line(line: string): void {
    const running = this.running;
    if (!running) return;
    let event: CodeEvent;
    try {
      event = JSON.parse(line) as CodeEvent;
    } catch {
      event = { type: 'stdout', text: `${line}\n` };
    }
    if (typeof event !== 'object' || event === null || typeof event.type !== 'string') {
      event = { type: 'stdout', text: `${line}\n` };
    }
    if (event.type === 'end') running.finish();
    else if (event.type === 'error') running.events.push(this.error(running, event));
    else running.events.push(event);
  }
}
