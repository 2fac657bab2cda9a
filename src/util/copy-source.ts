import { type Stats, statSync } from 'node:fs';
import { InvalidArgumentError } from '../errors.js';

/**
 * The host file or folder a copy into a sandbox starts from (a template's `copy` step, an
 * upload): its stats, or an InvalidArgumentError saying why it cannot be copied.
 */
export function copySource(from: string): Stats {
  let stats: Stats;
  try {
    stats = statSync(from);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    throw new InvalidArgumentError(`cannot copy ${from}: ${(error as Error).message}`, {
      ...(code ? { code } : {}),
    });
  }
  if (!stats.isFile() && !stats.isDirectory()) {
    throw new InvalidArgumentError(`cannot copy ${from}: it is neither a file nor a folder`);
  }
  return stats;
}
