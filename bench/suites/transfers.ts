// `--only transfers` (bench/README.md).
import { spawnSync } from 'node:child_process';
import { createReadStream, createWriteStream, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Sandbox } from 'abx-sandbox';
import { goal, HOME, log, results, row } from '../runner.js';
import { median, round, timeEach } from '../stats.js';

export async function transfers(sandbox: Sandbox) {
  log('upload / download');
  const sizes = [1, 256];
  const figures: Record<string, number> = {};
  const dir = mkdtempSync(join(HOME, 'transfer-'));
  for (const mib of sizes) {
    const data = Buffer.alloc(mib * 1024 * 1024, 7);
    const file = join(dir, `data-${mib}.bin`);
    writeFileSync(file, data);
    const rate = (seconds: number) => round(mib / seconds, 1);
    const time = async (fn: () => Promise<unknown>) => {
      const samples = await timeEach(mib > 8 ? 3 : 10, fn, 1);
      return median(samples) / 1000;
    };
    figures[`cp ${mib} MiB`] = rate(
      await time(async () => {
        spawnSync('cp', [file, `${file}.copy`]);
      }),
    );
    // File to file, as cp: a host file streamed into the sandbox, a sandbox file streamed into
    // a host file.
    figures[`envd upload ${mib} MiB`] = rate(
      await time(() =>
        sandbox.files.write('/tmp/up.bin', createReadStream(file, { highWaterMark: 1 << 20 })),
      ),
    );
    figures[`envd download ${mib} MiB`] = rate(
      await time(async () =>
        pipeline(
          (await sandbox.files.read('/tmp/up.bin', { format: 'stream' })) as Readable,
          createWriteStream(`${file}.down`),
        ),
      ),
    );
    // File to file by the SDK's own calls: with the daemon on loopback, the gateway copies the
    // file by descriptor (docs/envd-api.md, "A local file by descriptor"), no byte on a socket.
    figures[`upload file ${mib} MiB`] = rate(
      await time(() => sandbox.files.upload(file, '/tmp/up-fd.bin')),
    );
    figures[`download file ${mib} MiB`] = rate(
      await time(() => sandbox.files.download('/tmp/up-fd.bin', `${file}.fd-down`)),
    );
    // Memory to file and file to memory: a Buffer sent, the file read whole into a new buffer.
    figures[`envd upload from memory ${mib} MiB`] = rate(
      await time(() => sandbox.files.write('/tmp/up.bin', data)),
    );
    figures[`envd download to memory ${mib} MiB`] = rate(
      await time(() => sandbox.files.read('/tmp/up.bin', { format: 'bytes' })),
    );
    if (mib <= 32) {
      const content = data.toString('base64');
      figures[`server upload ${mib} MiB`] = rate(
        await time(() =>
          sandbox.server.call('upload', { path: '/tmp/up2.bin', content, encoding: 'base64' }),
        ),
      );
      figures[`server download ${mib} MiB`] = rate(
        await time(() => sandbox.server.call('download', { path: '/tmp/up2.bin' })),
      );
    }
  }
  rmSync(dir, { recursive: true, force: true });
  results.transfersMBps = figures;
  const ofCp = (name: string) =>
    (figures[`${name} 256 MiB`] ?? Number.NaN) / (figures['cp 256 MiB'] ?? Number.NaN);
  goal(
    'upload256ShareOfCp',
    "256 MiB upload file to file (files.upload), over cp's speed (ratio 0–1)",
    ofCp('upload file'),
    '',
    0.5,
    true,
    { value: figures['cp 256 MiB'] ?? Number.NaN, unit: 'MiB/s', what: '`cp` of the same file' },
  );
  goal(
    'download256ShareOfCp',
    "256 MiB download file to file (files.download), over cp's speed (ratio 0–1)",
    ofCp('download file'),
    '',
    0.5,
    true,
    { value: figures['cp 256 MiB'] ?? Number.NaN, unit: 'MiB/s', what: '`cp` of the same file' },
  );
  for (const mib of sizes) {
    const f = (name: string) => figures[`${name} ${mib} MiB`];
    row(
      '6 transfers',
      `${mib} MiB: cp / envd up / envd down${mib <= 32 ? ' / server up / server down' : ''}`,
      `${[f('cp'), f('envd upload'), f('envd download'), f('server upload'), f('server download')].filter((v) => v !== undefined).join(' / ')} MiB/s`,
      `file to file: upload ${Math.round((100 * (f('envd upload') ?? 0)) / (f('cp') ?? 1))}%, download ${Math.round((100 * (f('envd download') ?? 0)) / (f('cp') ?? 1))}% of cp (goal ≥ 50%)`,
    );
    row(
      '6 transfers',
      `${mib} MiB: files.upload / files.download (a local file by descriptor)`,
      `${f('upload file')} / ${f('download file')} MiB/s`,
      `upload ${Math.round((100 * (f('upload file') ?? 0)) / (f('cp') ?? 1))}%, download ${Math.round((100 * (f('download file') ?? 0)) / (f('cp') ?? 1))}% of cp (goal ≥ 50%); streams: the row above`,
    );
    row(
      '6 transfers',
      `${mib} MiB: envd up from memory / down to memory`,
      `${f('envd upload from memory')} / ${f('envd download to memory')} MiB/s`,
    );
  }
}
