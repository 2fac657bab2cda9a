import 'reflect-metadata';

// `node dist/daemon.js`: the daemon in the foreground. `abx daemon start` and the SDK start it
// detached with its output in $ABX_HOME/daemon.log. Imported after the polyfill on purpose.
const { Daemon } = await import('./daemon.js');
const { abxHome } = await import('../installation/paths.js');

const daemon = new Daemon({
  home: abxHome(),
  ...(process.env.ABX_API_PORT ? { apiPort: Number(process.env.ABX_API_PORT) } : {}),
  ...(process.env.ABX_GATEWAY_PORT ? { gatewayPort: Number(process.env.ABX_GATEWAY_PORT) } : {}),
  ...(process.env.ABX_DOMAIN ? { domain: process.env.ABX_DOMAIN } : {}),
  ...(process.env.ABX_WARM_POOL ? { warmPool: Number(process.env.ABX_WARM_POOL) } : {}),
});
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.on(signal, () => void daemon.stop());
}
const info = await daemon.start();
console.log(JSON.stringify({ event: 'listening', ...info }));
await daemon.stopped;
console.log(JSON.stringify({ event: 'stopped', pid: process.pid }));
