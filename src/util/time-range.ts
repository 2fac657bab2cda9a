import { InvalidArgumentError } from '../errors.js';

/**
 * A time bound of the query (`start` or `end`): a whole number of `unit` since the epoch, or
 * undefined when absent. Anything else is an InvalidArgumentError naming the parameter.
 */
export function timeBound(
  query: URLSearchParams,
  name: 'start' | 'end',
  unit: 'ms' | 's',
): number | undefined {
  const text = query.get(name);
  if (text === null || text === '') return undefined;
  const value = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(value)) {
    throw new InvalidArgumentError(
      `${name} must be a time as a whole number of ${unit === 'ms' ? 'milliseconds' : 'seconds'} since the epoch, not '${text}'`,
    );
  }
  return value;
}

/** Both bounds, checked to be in order. */
export function timeRange(
  query: URLSearchParams,
  unit: 'ms' | 's',
): { start?: number; end?: number } {
  const start = timeBound(query, 'start', unit);
  const end = timeBound(query, 'end', unit);
  if (start !== undefined && end !== undefined && start > end) {
    throw new InvalidArgumentError(`start (${start}) is after end (${end}): give start <= end`);
  }
  return { ...(start === undefined ? {} : { start }), ...(end === undefined ? {} : { end }) };
}
