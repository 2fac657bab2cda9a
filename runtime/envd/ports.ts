import { rmSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { BadRequestError } from '../server/errors.js';
import { defineGroup } from '../server/route-group.js';
import { splice } from '../server/splice.js';

/**
 * Port forwarding for the host's gateway. The sandbox has its own network namespace, so the host
 * cannot dial 127.0.0.1:PORT inside it; instead envd listens on `{portsDir}/{PORT}.sock` (a
 * folder shared with the host) and pipes each connection to 127.0.0.1:PORT. Raw bytes both ways,
 * so HTTP, streaming and WebSocket upgrades all pass.
 */
export function portsGroup(portsDir: string, tcpHost?: string) {
  const forwarders = new Map<number, Server>();
  const tcpForwarders = new Map<number, Server>();
  const opening = new Map<number, Promise<string>>();
  // Connections being forwarded now: they keep envd awake (idle.ts).
  let forwarding = 0;
  const forward = (client: Socket, port: number) => {
    forwarding++;
    client.once('close', () => forwarding--);
    splice(client, connect(port, '127.0.0.1'));
  };

  // Concurrent first requests for one port share one attempt.
  const open = (port: number): Promise<string> => {
    let pending = opening.get(port);
    if (!pending) {
      pending = start(port).finally(() => opening.delete(port));
      opening.set(port, pending);
    }
    return pending;
  };

  const start = async (port: number): Promise<string> => {
    const socketPath = join(portsDir, `${port}.sock`);
    if (tcpHost !== undefined && tcpHost !== '127.0.0.1') await listenTcp(port);
    if (forwarders.has(port)) return socketPath;
    // A process in the sandbox may serve the socket itself (the command server does, to spare
    // this hop); only a stale file is replaced.
    if (await accepts(socketPath)) return socketPath;
    rmSync(socketPath, { force: true });
    const server = createServer((client) => forward(client, port));
    forwarders.set(port, server);
    return new Promise((resolve, reject) => {
      server.once('error', (error) => {
        forwarders.delete(port);
        reject(error);
      });
      server.listen(socketPath, () => resolve(socketPath));
    });
  };

  /**
   * In a pod the host reaches port P at the pod's address: forward `tcpHost:P` to 127.0.0.1:P (a
   * server bound to 127.0.0.1 only, like the command server, is reachable too). When something
   * in the sandbox already listens on all addresses, the port is in use and reachable as it is.
   */
  const listenTcp = (port: number) =>
    new Promise<void>((resolve, reject) => {
      if (tcpForwarders.has(port)) return resolve();
      const server = createServer((client) => forward(client, port));
      server.once('error', (error: NodeJS.ErrnoException) => {
        if (error.code === 'EADDRINUSE') resolve();
        else reject(error);
      });
      server.listen({ host: tcpHost, port, exclusive: true }, () => {
        tcpForwarders.set(port, server);
        resolve();
      });
    });

  const accepts = (socketPath: string) =>
    new Promise<boolean>((resolve) => {
      const probe = connect(socketPath);
      probe.once('connect', () => {
        probe.destroy();
        resolve(true);
      });
      probe.once('error', () => resolve(false));
    });

  const portOf = (text: string | undefined) => {
    const port = Number(text);
    if (!/^\d+$/.test(text ?? '') || port < 1 || port > 65535) {
      throw new BadRequestError(`${JSON.stringify(text)} is not a TCP port (1-65535)`);
    }
    return port;
  };

  const group = defineGroup('PORTS', '/ports', 'forward ports of the sandbox to the host gateway', [
    {
      method: 'POST',
      path: '/ports/{port}',
      summary: 'Starts forwarding 127.0.0.1:PORT to `{portsDir}/PORT.sock` (idempotent).',
      body: 'none',
      handler: async ({ params }) => {
        const port = portOf(params.port);
        return { port, socket: await open(port) };
      },
    },
    {
      method: 'GET',
      path: '/ports',
      summary: 'Ports being forwarded.',
      handler: () => ({ ports: [...forwarders.keys()].sort((a, b) => a - b) }),
    },
    {
      method: 'DELETE',
      path: '/ports/{port}',
      summary: 'Stops forwarding a port.',
      body: 'none',
      handler: ({ params }) => {
        const port = portOf(params.port);
        forwarders.get(port)?.close();
        forwarders.delete(port);
        tcpForwarders.get(port)?.close();
        tcpForwarders.delete(port);
        rmSync(join(portsDir, `${port}.sock`), { force: true });
        return { port, forwarding: false };
      },
    },
  ]);
  return Object.assign(group, {
    /** Connections being forwarded now. */
    forwarding: () => forwarding,
    /**
     * Closes every forwarder and removes its socket (envd going to sleep): the gateway then finds
     * no socket and asks envd again (`POST /ports/{port}`), which wakes it.
     */
    closeAll: () => {
      for (const [port, server] of forwarders) {
        server.close();
        rmSync(join(portsDir, `${port}.sock`), { force: true });
      }
      for (const server of tcpForwarders.values()) server.close();
      forwarders.clear();
      tcpForwarders.clear();
    },
  });
}
