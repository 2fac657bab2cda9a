import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { dockerMessage, engineError, statusOf } from '../../src/providers/docker/engine.js';
import {
  DockerEngine,
  EngineApiError,
  followProgress,
  logText,
  ProgressError,
} from '../../src/providers/docker/engine-client.js';

// The engine client's own rules, against a node:http server on a Unix socket that answers as an
// engine would (or does not answer at all): errors, progress streams, frames, limits. The calls
// against a real engine are in the Docker tests (docker.contract, registry-push, volumes-docker).

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

let folder: string;
let server: Server;
let handler: Handler = (_req, res) => res.end();
const socket = () => join(folder, 'engine.sock');

beforeAll(async () => {
  folder = mkdtempSync(join(tmpdir(), 'abx-engine-client-'));
  server = createServer((req, res) => handler(req, res));
  await new Promise<void>((resolve) => server.listen(socket(), resolve));
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  rmSync(folder, { recursive: true, force: true });
});

describe('the Docker engine client', () => {
  test("a failure keeps the status and Docker's own message, as engine.ts reads them", async () => {
    let seen = '';
    handler = (req, res) => {
      seen = `${req.method} ${req.url}`;
      res.writeHead(404, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ message: 'No such container: abx-x\n' }));
    };
    const docker = new DockerEngine({ socketPath: socket() });
    try {
      const error = await docker
        .getContainer('abx-x')
        .inspect()
        .catch((thrown: unknown) => thrown);
      expect(seen).toBe('GET /containers/abx-x/json');
      expect(error).toBeInstanceOf(EngineApiError);
      expect(statusOf(error)).toBe(404);
      expect(dockerMessage(error)).toBe('No such container: abx-x');
      expect(engineError(error, 'docker inspect').message).toBe(
        'docker inspect: No such container: abx-x',
      );
    } finally {
      docker.close();
    }
  });

  test('queries as the engine reads them: filters as JSON, lists as repeated keys', async () => {
    const urls: string[] = [];
    handler = (req, res) => {
      urls.push(req.url ?? '');
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(req.url?.startsWith('/system/df') ? '{"Volumes":[]}' : '[]');
    };
    const docker = new DockerEngine({ socketPath: socket() });
    try {
      await docker.listContainers({ all: true, filters: { label: ['abx.sandbox=a b'] } });
      await docker.systemDf({ type: ['volume'] });
      expect(urls.map((url) => decodeURIComponent(url))).toEqual([
        '/containers/json?all=true&filters={"label":["abx.sandbox=a b"]}',
        '/system/df?type=volume',
      ]);
    } finally {
      docker.close();
    }
  });

  test('a push carries its credentials as base64url JSON in X-Registry-Auth', async () => {
    let auth = '';
    handler = (req, res) => {
      auth = String(req.headers['x-registry-auth']);
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end('{"aux":{"Digest":"sha256:ab"}}\n');
    };
    const docker = new DockerEngine({ socketPath: socket() });
    try {
      const credentials = { username: 'bob', password: '>>>???', serveraddress: 'r.example' };
      const events = await followProgress(
        await docker.getImage('r.example/a:1').push({ authconfig: credentials }),
      );
      expect(JSON.parse(Buffer.from(auth, 'base64url').toString('utf8'))).toEqual(credentials);
      expect(auth).not.toMatch(/[+/]/);
      expect(events).toEqual([{ aux: { Digest: 'sha256:ab' } }]);
    } finally {
      docker.close();
    }
  });

  test('a progress stream fails on its first error, with every event read', async () => {
    const lines = [
      { stream: 'Step 1/2\n' },
      { errorDetail: { message: 'exit code 1' }, error: 'exit code 1' },
      { error: 'later' },
    ];
    const stream = Readable.from([
      `${JSON.stringify(lines[0])}\n${JSON.stringify(lines[1]).slice(0, 10)}`,
      `${JSON.stringify(lines[1]).slice(10)}\n${JSON.stringify(lines[2])}`,
    ]);
    const seen: unknown[] = [];
    const error = await followProgress(stream, (event) => seen.push(event)).catch(
      (thrown: unknown) => thrown,
    );
    expect(error).toBeInstanceOf(ProgressError);
    expect((error as Error).message).toBe('exit code 1');
    expect(seen).toEqual(lines);
    await expect(followProgress(Readable.from(['{"status":"ok"}\nnot json\n']))).rejects.toThrow(
      /not JSON: not json/,
    );
  });

  test('a log: frames of 8-byte headers in order; a TTY log as it is', () => {
    const frame = (stream: number, text: string) => {
      const body = Buffer.from(text);
      const header = Buffer.alloc(8);
      header[0] = stream;
      header.writeUInt32BE(body.length, 4);
      return Buffer.concat([header, body]);
    };
    expect(logText(Buffer.concat([frame(1, 'out\n'), frame(2, 'err\n'), frame(1, 'end')]))).toBe(
      'out\nerr\nend',
    );
    expect(logText(Buffer.from('v24.0.0'))).toBe('v24.0.0');
  });

  test('an engine that does not answer: ETIMEDOUT naming it, the call and the limit', async () => {
    handler = () => undefined; // never answers
    const docker = new DockerEngine({ socketPath: socket() });
    try {
      const started = Date.now();
      const error = await docker.ping({ timeoutMs: 200 }).catch((thrown: unknown) => thrown);
      expect(Date.now() - started).toBeLessThan(2000);
      expect(error).toMatchObject({ code: 'ETIMEDOUT' });
      expect((error as Error).message).toBe(
        `the Docker engine at ${socket()} did not finish GET /_ping within 0.2 s`,
      );
    } finally {
      docker.close();
    }
  });

  test('no socket there: the errno engine.ts maps to an UnavailableError', async () => {
    const docker = new DockerEngine({ socketPath: join(folder, 'none.sock') });
    const error = await docker.info().catch((thrown: unknown) => thrown);
    expect(error).toMatchObject({ code: 'ENOENT' });
    expect(engineError(error, 'cannot use Docker', docker.address).name).toBe('UnavailableError');
    docker.close();
  });

  test('DOCKER_HOST over SSH is refused, saying how to forward the socket', async () => {
    const saved = process.env.DOCKER_HOST;
    process.env.DOCKER_HOST = 'ssh://me@builder';
    try {
      const docker = new DockerEngine();
      await expect(docker.info()).rejects.toThrow(/not SSH; forward its socket \(ssh -nNT -L/);
      docker.close();
    } finally {
      if (saved === undefined) delete process.env.DOCKER_HOST;
      else process.env.DOCKER_HOST = saved;
    }
  });
});
