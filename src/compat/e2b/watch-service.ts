import { create } from '@bufbuild/protobuf';
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from '@connectrpc/connect';
import { envdJson, envdLines } from './envd-client.js';
import { entryOf, type NativeEntry, pathArg } from './filesystem-service.js';
import {
  EventType,
  type FilesystemEvent,
  FilesystemEventSchema,
  type Filesystem as FilesystemService,
  type WatchDirResponse,
} from './gen/filesystem/filesystem_pb.js';
import { keepaliveMs, userTarget } from './process-service.js';

/** An event of envd's `/files/watch` (docs/envd-api.md, WATCH). */
interface NativeWatchEvent {
  type: 'create' | 'write' | 'remove' | 'rename' | 'chmod';
  name: string;
  path: string;
  entry?: NativeEntry;
}

interface NativeWatchEnd {
  reason: 'removed' | 'limit' | 'error';
  message: string;
}

const TYPES: Record<NativeWatchEvent['type'], EventType> = {
  create: EventType.CREATE,
  write: EventType.WRITE,
  remove: EventType.REMOVE,
  rename: EventType.RENAME,
  chmod: EventType.CHMOD,
};

function eventOf(native: NativeWatchEvent, includeEntry: boolean): FilesystemEvent {
  return create(FilesystemEventSchema, {
    name: native.name,
    type: TYPES[native.type] ?? EventType.UNSPECIFIED,
    ...(includeEntry && native.entry ? { entry: entryOf(native.entry) } : {}),
  });
}

/** A watch that ended by itself, as the Connect error that ends the RPC. */
function endError(end: NativeWatchEnd): ConnectError {
  const code =
    end.reason === 'removed'
      ? Code.NotFound
      : end.reason === 'limit'
        ? Code.ResourceExhausted
        : Code.Internal;
  return new ConnectError(end.message, code);
}

function watchQuery(path: string, recursive: boolean): string {
  return `path=${encodeURIComponent(path)}&recursive=${recursive}`;
}

/**
 * A watcher id of the polled form: envd's id, marked when the client asked for entries. The face
 * keeps no state, so what GetWatcherEvents must know travels in the id the client sends back.
 */
const ENTRY_MARK = '.entry';

function nativeId(watcherId: string): string {
  if (watcherId === '') {
    throw new ConnectError(
      'watcherId is empty: send the id CreateWatcher gave',
      Code.InvalidArgument,
    );
  }
  const id = watcherId.endsWith(ENTRY_MARK) ? watcherId.slice(0, -ENTRY_MARK.length) : watcherId;
  return encodeURIComponent(id);
}

/** Whether the RPC's own signal ended it (client gone, or Connect-Timeout-Ms passed). */
function rethrow(error: unknown, context: HandlerContext): never {
  if (context.signal.aborted) throw context.signal.reason;
  throw error;
}

/** WatchDir and the polled watcher trio over envd's WATCH routes. */
export const watchService: Partial<ServiceImpl<typeof FilesystemService>> = {
  async *watchDir(request, context): AsyncGenerator<WatchDirResponse> {
    const target = userTarget(context);
    const path = pathArg(request.path, 'path');
    const lines = await envdLines(
      target,
      'GET',
      `/files/watch?${watchQuery(path, request.recursive)}`,
      undefined,
      context.signal,
    ).catch((error: unknown) => rethrow(error, context));
    const every = keepaliveMs(context);
    let pending: Promise<IteratorResult<unknown>> | undefined;
    try {
      const first = await lines.next();
      if (first.done || !(first.value as { start?: unknown }).start) {
        throw new ConnectError('envd did not start the watch', Code.Internal);
      }
      yield {
        $typeName: 'filesystem.WatchDirResponse',
        event: { case: 'start', value: { $typeName: 'filesystem.WatchDirResponse.StartEvent' } },
      };
      for (;;) {
        pending ??= lines.next();
        let timer: NodeJS.Timeout | undefined;
        const next = await (every === undefined
          ? pending
          : Promise.race([
              pending,
              new Promise<'keepalive'>((resolve) => {
                timer = setTimeout(() => resolve('keepalive'), every);
              }),
            ]));
        clearTimeout(timer);
        if (next === 'keepalive') {
          yield {
            $typeName: 'filesystem.WatchDirResponse',
            event: {
              case: 'keepalive',
              value: { $typeName: 'filesystem.WatchDirResponse.KeepAlive' },
            },
          };
          continue;
        }
        pending = undefined;
        if (next.done) break;
        const line = next.value as { event?: NativeWatchEvent; end?: NativeWatchEnd };
        if (line.event) {
          yield {
            $typeName: 'filesystem.WatchDirResponse',
            event: { case: 'filesystem', value: eventOf(line.event, request.includeEntry) },
          };
        } else if (line.end) {
          throw endError(line.end);
        }
        // `dropped` (a slow reader lost events) and envd's own keepalives have no E2B form.
      }
    } catch (error) {
      rethrow(error, context);
    } finally {
      pending?.catch(() => {});
      await lines.return?.();
    }
    if (context.signal.aborted) throw context.signal.reason;
    throw new ConnectError('the watch stream from envd ended', Code.Unavailable);
  },

  async createWatcher(request, context) {
    const target = userTarget(context);
    const path = pathArg(request.path, 'path');
    const { id } = await envdJson<{ id: string }>(
      target,
      'POST',
      '/files/watch',
      { path, recursive: request.recursive },
      context.signal,
    );
    return { watcherId: request.includeEntry ? `${id}${ENTRY_MARK}` : id };
  },

  async getWatcherEvents(request, context) {
    const target = userTarget(context);
    const answer = await envdJson<{ events: NativeWatchEvent[]; end?: NativeWatchEnd }>(
      target,
      'GET',
      `/files/watch/${nativeId(request.watcherId)}`,
      undefined,
      context.signal,
    );
    // Events first; once they are all read, a watch that ended says why.
    if (answer.events.length === 0 && answer.end) throw endError(answer.end);
    const includeEntry = request.watcherId.endsWith(ENTRY_MARK);
    return { events: answer.events.map((event) => eventOf(event, includeEntry)) };
  },

  async removeWatcher(request, context) {
    const target = userTarget(context);
    await envdJson(
      target,
      'DELETE',
      `/files/watch/${nativeId(request.watcherId)}`,
      undefined,
      context.signal,
    );
    return {};
  },
};
