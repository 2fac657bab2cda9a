import {
  create,
  type DescMethod,
  type DescMethodServerStreaming,
  type DescMethodUnary,
  isMessage,
} from '@bufbuild/protobuf';
import {
  Code,
  ConnectError,
  type ContextValues,
  createHandlerContext,
  type HandlerContext,
} from '@connectrpc/connect';
import {
  createMethodSerializationLookup,
  encodeEnvelope,
  mergeNonProtocolHeaders,
  type UniversalHandlerOptions,
  validateUniversalHandlerOptions,
} from '@connectrpc/connect/protocol';
import {
  codeToHttpStatus,
  contentTypeStreamJson,
  contentTypeUnaryJson,
  createEndStreamSerialization,
  endStreamFlag,
  errorToJsonBytes,
  headerContentType,
  headerStreamEncoding,
  headerTimeout,
  headerUnaryContentLength,
  headerUnaryEncoding,
  parseContentType,
  parseTimeout,
  trailerMux,
} from '@connectrpc/connect/protocol-connect';

/** A server-streaming method's implementation, as a `ServiceImpl` holds it. */
export type ServerStreamImpl = (
  request: never,
  context: HandlerContext,
) => AsyncIterable<unknown> | AsyncGenerator<unknown>;

/** A unary method's implementation, as a `ServiceImpl` holds it. */
export type UnaryImpl = (request: never, context: HandlerContext) => unknown;

/** One call, as the E2B face hands it over: the body is read whole. */
export interface StreamCall {
  method: string;
  url: string;
  header: Headers;
  body: Uint8Array;
  signal: AbortSignal;
  contextValues: ContextValues;
}

/** A unary answer: the status, the headers (trailers in them as `trailer-*`) and the body whole. */
export interface UnaryAnswer {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

/** The answer: a Connect stream of envelopes, the last one the end-stream message. */
export interface StreamAnswer {
  status: number;
  headers: Headers;
  body: AsyncIterable<Uint8Array>;
}

/**
 * What the context's signal is aborted with once a call ended normally, or once the client
 * stopped reading. Connect aborts with a fresh `DOMException` there (tens of microseconds each);
 * nothing reads this reason but code that checks for a deadline, which it is not.
 */
const CALL_ENDED = new ConnectError('the call ended', Code.Canceled);

/** The router's options, checked, and the method's JSON serializations, as connect's handler has them. */
function jsonSerializations(method: DescMethod, options: Partial<UniversalHandlerOptions>) {
  const opt = validateUniversalHandlerOptions(options);
  const serialization = createMethodSerializationLookup(
    method,
    opt.binaryOptions,
    opt.jsonOptions,
    opt,
  );
  return { opt, input: serialization.getI(false), output: serialization.getO(false) };
}

/** A call's handler context (its deadline, signal and headers), as connect's handler makes it. */
function contextOf(
  method: DescMethod,
  call: StreamCall,
  timeoutMs: number | undefined,
  contentType: string,
): ReturnType<typeof createHandlerContext> {
  return createHandlerContext({
    method,
    service: method.parent,
    requestMethod: call.method,
    protocolName: 'connect',
    timeoutMs,
    requestSignal: call.signal,
    requestHeader: call.header,
    url: call.url,
    responseHeader: { [headerContentType]: contentType },
    contextValues: call.contextValues,
  });
}

/**
 * A server-streaming method of Connect's protocol with the JSON codec, answered the way
 * connect's own handler answers it (`createConnectRouter`), for the one request shape E2B's SDKs
 * send: POST, `application/connect+json`, no compression, a valid deadline, and a body that is one
 * uncompressed envelope holding a message that parses. It is built from connect's and
 * protobuf-es's own parts (the method's serializations with the router's limits, the handler
 * context with its deadline, the envelope and end-stream encodings), without connect's pipeline of
 * async generators: that pipeline costs about 0.5 ms on a 2-core machine before the
 * implementation runs, and as much again around the last message (bench/README.md, "E2B's SDK
 * against abx"). Any other request answers `undefined`, and the face hands it to connect's
 * handler, which answers it (and every error of the request's shape) itself.
 * `test/compat/e2b/connect-stream.test.ts` holds both to byte-equal answers.
 */
export function serverStreamHandler(
  method: DescMethodServerStreaming,
  impl: ServerStreamImpl,
  options: Partial<UniversalHandlerOptions>,
): (call: StreamCall) => Promise<StreamAnswer | undefined> {
  const { opt, input, output } = jsonSerializations(method, options);
  const endStream = createEndStreamSerialization(opt.jsonOptions);
  return async (call) => {
    if (call.method !== 'POST') return undefined;
    const type = parseContentType(call.header.get(headerContentType));
    if (!type?.stream || type.binary) return undefined;
    const encoding = call.header.get(headerStreamEncoding);
    if (encoding !== null && encoding !== 'identity') return undefined;
    const timeout = parseTimeout(call.header.get(headerTimeout), opt.maxTimeoutMs);
    if (timeout.error) return undefined;
    const body = call.body;
    if (body.length < 5 || body[0] !== 0) return undefined;
    const length = new DataView(body.buffer, body.byteOffset, body.byteLength).getUint32(1);
    if (length !== body.length - 5 || length > opt.readMaxBytes) return undefined;
    let message: unknown;
    try {
      message = input.parse(body.subarray(5));
    } catch {
      return undefined;
    }
    const context = contextOf(method, call, timeout.timeoutMs, contentTypeStreamJson);
    const envelopes = envelopesOf(impl(message as never, context), method, context, {
      message: (m) => output.serialize(m as never),
      end: (end) => endStream.serialize(end),
    });
    // As connect's handler: the answer (its headers) waits for the first envelope, so that an
    // implementation can set headers before they are sent.
    let first: IteratorResult<Uint8Array> | undefined = await envelopes.next();
    return {
      status: 200,
      headers: context.responseHeader,
      body: {
        [Symbol.asyncIterator]: () => ({
          next: () => {
            const taken = first;
            first = undefined;
            return taken ? Promise.resolve(taken) : envelopes.next();
          },
          return: (value?: unknown) => envelopes.return(value as undefined),
        }),
      },
    };
  };
}

/** The implementation's messages as envelopes, then the end-stream envelope (as connect's). */
async function* envelopesOf(
  messages: AsyncIterable<unknown>,
  method: DescMethodServerStreaming,
  context: ReturnType<typeof createHandlerContext>,
  serialize: {
    message: (message: unknown) => Uint8Array;
    end: (end: { metadata: Headers; error: ConnectError | undefined }) => Uint8Array;
  },
): AsyncGenerator<Uint8Array> {
  let error: ConnectError | undefined;
  try {
    for await (const item of messages) {
      yield encodeEnvelope(0, serialize.message(create(method.output, item as never)));
    }
  } catch (e) {
    context.abort(e);
    error =
      e instanceof ConnectError
        ? e
        : new ConnectError('internal error', Code.Internal, undefined, undefined, e);
  } finally {
    // Also when the client stopped reading (`return`: the implementation was told to stop): the
    // signal is aborted and the deadline's timer cleared, whatever ended the call.
    context.abort(CALL_ENDED);
  }
  yield encodeEnvelope(endStreamFlag, serialize.end({ metadata: context.responseTrailer, error }));
}

/**
 * A unary method of Connect's protocol with the JSON codec, answered the way connect's own
 * handler answers it, for the request E2B's SDKs send: POST, `application/json`, no compression,
 * a valid deadline, and a body that parses as the method's message (`Connect-Protocol-Version` is
 * not required, as the router is set up). As {@link serverStreamHandler}: connect's own parts (serializations with the router's
 * limits, the handler context and its deadline, error JSON, the trailer prefixing), not its
 * protocol negotiation and call pipeline, and the context aborted with a constant reason at the
 * end instead of a fresh `DOMException`; any other request answers `undefined` and goes to
 * connect's handler. `test/compat/e2b/connect-stream.test.ts` holds both to byte-equal answers.
 */
export function unaryHandler(
  method: DescMethodUnary,
  impl: UnaryImpl,
  options: Partial<UniversalHandlerOptions>,
): (call: StreamCall) => Promise<UnaryAnswer | undefined> {
  const { opt, input, output } = jsonSerializations(method, options);
  return async (call) => {
    if (call.method !== 'POST') return undefined;
    const type = parseContentType(call.header.get(headerContentType));
    if (!type || type.stream || type.binary) return undefined;
    const encoding = call.header.get(headerUnaryEncoding);
    if (encoding !== null && encoding !== 'identity') return undefined;
    const timeout = parseTimeout(call.header.get(headerTimeout), opt.maxTimeoutMs);
    if (timeout.error || call.body.length > opt.readMaxBytes) return undefined;
    let message: unknown;
    try {
      message = input.parse(call.body);
    } catch {
      return undefined;
    }
    const context = contextOf(method, call, timeout.timeoutMs, contentTypeUnaryJson);
    let status = 200;
    let body: Uint8Array;
    try {
      const result = await impl(message as never, context);
      body = output.serialize(
        isMessage(result, method.output) ? result : create(method.output, result as never),
      );
    } catch (e) {
      context.abort(e);
      const error =
        e instanceof ConnectError
          ? e
          : new ConnectError('internal error', Code.Internal, undefined, undefined, e);
      status = codeToHttpStatus(error.code);
      context.responseHeader.set(headerContentType, contentTypeUnaryJson);
      if (!error.isWireError) mergeNonProtocolHeaders(context.responseHeader, error.metadata);
      body = errorToJsonBytes(error, opt.jsonOptions);
    } finally {
      context.abort(CALL_ENDED);
    }
    const headers = trailerMux(context.responseHeader, context.responseTrailer);
    headers.set(headerUnaryContentLength, body.byteLength.toString(10));
    return { status, headers, body };
  };
}
