// `--only volumes` (bench/README.md).
import { Sandbox, Volume } from 'abx-sandbox';
import { log, ms, results, row, scale } from '../runner.js';
import { round, type Summary, summarize } from '../stats.js';

/**
 * Volumes (issue 29): making and removing a 1 GiB volume, and what mounting one costs a create:
 * cold create → first command with one volume and without (both with a network policy of their
 * own, so neither comes from the warm pool), one of each per round. Then 64 MiB written and
 * synced to the volume against the same to the sandbox's own home.
 */
export async function volumes(template: string) {
  log('volumes: create and remove, a create that mounts one, writes');
  const times = {
    make: [] as number[],
    remove: [] as number[],
    plain: [] as number[],
    mounted: [] as number[],
  };
  const name = 'bench-volume';
  const own = { network: { allowOut: [], denyOut: [] } };
  const made = await Volume.create(name, { size: '1G' });
  try {
    for (let i = 0; i < scale(10, 3); i++) {
      const t0 = performance.now();
      const volume = await Volume.create(`${name}-${i}`, { size: '1G' });
      times.make.push(performance.now() - t0);
      const t1 = performance.now();
      await volume.remove();
      times.remove.push(performance.now() - t1);
    }
    for (let i = 0; i < scale(20, 5); i++) {
      for (const [into, mounts] of [
        [times.plain, []],
        [times.mounted, [{ name, path: '/mnt/data' }]],
      ] as const) {
        const t0 = performance.now();
        const box = await Sandbox.create({ template, ...own, volumeMounts: [...mounts] });
        await box.commands.run('true');
        into.push(performance.now() - t0);
        await box.kill();
      }
    }
    const box = await Sandbox.create({ template, volumeMounts: [{ name, path: '/mnt/data' }] });
    const write = { volume: [] as number[], home: [] as number[] };
    try {
      for (let i = 0; i < scale(5, 2); i++) {
        for (const [into, dir] of [
          [write.volume, '/mnt/data'],
          [write.home, '~'],
        ] as const) {
          const t0 = performance.now();
          await box.commands.run(
            `head -c 64M /dev/zero > ${dir}/w && sync ${dir}/w && rm ${dir}/w`,
          );
          into.push(performance.now() - t0);
        }
      }
    } finally {
      await box.kill();
    }
    const [mk, rm, plain, mounted] = [times.make, times.remove, times.plain, times.mounted].map(
      summarize,
    ) as Summary[];
    const [wv, wh] = [summarize(write.volume), summarize(write.home)];
    results.volumes = {
      create: mk,
      remove: rm,
      coldCreate: plain,
      coldCreateWithVolume: mounted,
      write64MiBVolume: wv,
      write64MiBHome: wh,
    };
    row(
      '14 volumes',
      'Volume.create (1 GiB)',
      ms(mk),
      'a sparse ext4 image, formatted and mounted (root daemon)',
    );
    row('14 volumes', 'Volume.remove', ms(rm), 'unmounted, then its folder removed');
    row(
      '14 volumes',
      'cold create → first command, one volume',
      ms(mounted),
      `${round(mounted.p50 / plain.p50, 2)}× the same without`,
    );
    row(
      '14 volumes',
      'cold create → first command, no volume (same rounds)',
      ms(plain),
      'a network policy of its own: never from the pool',
    );
    row(
      '14 volumes',
      'write + sync 64 MiB to the volume',
      ms(wv),
      `${round(wv.p50 / wh.p50, 2)}× the same to its home`,
    );
  } finally {
    await made.remove().catch(() => false);
  }
}
