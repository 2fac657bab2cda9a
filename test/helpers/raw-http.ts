import { connect, type Socket } from 'node:net';

// Raw HTTP/1.1 on one client connection, for tests of the gateway's connection handling: requests
// are written as given, answers read one at a time.

export interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
  // biome-ignore lint/suspicious/noExplicitAny: bodies are checked field by field
  json: any;
}

/** One client connection, raw: requests are written as given, answers read one at a time. */
export class RawConnection {
  readonly socket: Socket;
  private buffer = Buffer.alloc(0);
  private ended = false;
  private wake: (() => void) | undefined;

  /** Bytes received and not read as an answer yet. */
  get unread(): number {
    return this.buffer.length;
  }

  constructor(port: number) {
    this.socket = connect(port, '127.0.0.1');
    this.socket.on('data', (chunk: Buffer) => {
      this.buffer = Buffer.concat([this.buffer, chunk]);
      this.wake?.();
    });
    this.socket.on('error', () => undefined);
    this.socket.on('close', () => {
      this.ended = true;
      this.wake?.();
    });
  }

  write(text: string | Buffer): void {
    this.socket.write(text);
  }

  /** Resolves when the gateway closed the connection. */
  async closed(): Promise<void> {
    while (!this.ended) await this.more();
  }

  private more(): Promise<void> {
    return new Promise((resolve) => {
      this.wake = () => {
        this.wake = undefined;
        resolve();
      };
    });
  }

  /** Bytes as they come, until `count` arrived. */
  async bytes(count: number): Promise<string> {
    while (this.buffer.length < count && !this.ended) await this.more();
    const text = this.buffer.subarray(0, count).toString('latin1');
    this.buffer = this.buffer.subarray(count);
    return text;
  }

  /** The next answer (interim 1xx answers included), its body read by its Content-Length. */
  async answer(): Promise<Answer> {
    let end = this.buffer.indexOf('\r\n\r\n');
    while (end < 0) {
      if (this.ended) throw new Error(`closed before an answer: ${this.buffer.toString()}`);
      await this.more();
      end = this.buffer.indexOf('\r\n\r\n');
    }
    const lines = this.buffer.subarray(0, end).toString('latin1').split('\r\n');
    const status = Number(lines[0]?.split(' ')[1]);
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
    }
    const length = status < 200 ? 0 : Number(headers['content-length'] ?? 0);
    while (this.buffer.length < end + 4 + length && !this.ended) await this.more();
    const body = this.buffer.subarray(end + 4, end + 4 + length).toString();
    this.buffer = this.buffer.subarray(end + 4 + length);
    let json: unknown;
    try {
      json = JSON.parse(body);
    } catch {
      json = undefined;
    }
    return { status, headers, body, json };
  }
}

/** A request as text. */
export function http(
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: string,
): string {
  const lines = [`${method} ${path} HTTP/1.1`];
  if (!('Host' in headers)) lines.push('Host: 127.0.0.1');
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  if (body !== undefined) lines.push(`Content-Length: ${Buffer.byteLength(body)}`);
  return `${lines.join('\r\n')}\r\n\r\n${body ?? ''}`;
}
