import type { Readable, Writable } from 'node:stream';
import { toToolCallError } from '../agent/tool-error.js';
import type { SandboxTool } from '../agent/tool-types.js';
import { abxHome } from '../installation/paths.js';
import { Sandbox } from '../sandbox/sandbox.js';
import { packageInfo } from '../util/package-info.js';
import { mcpFailure, mcpSuccess, mcpToolInfo } from './tool-result.js';

/** Options of {@link serveMcp}: name a running sandbox, or a template to create one from. */
export interface ServeMcpOptions {
  /** A running sandbox to serve. It is left running when the server stops. */
  sandboxId?: string;
  /** A template: a sandbox is created on first use and killed when the server stops. */
  template?: string;
  /** `$ABX_HOME` of the installation; default the environment's or `~/.abx`. */
  home?: string;
  /** Compiled modules with `@sandbox` classes to serve on the command server (started on first use). */
  modules?: string[];
  /** Where requests come from; default `process.stdin`. */
  input?: Readable;
  /** Where responses go; default `process.stdout`. Nothing else may write there. */
  output?: Writable;
}

/** A running MCP server; see {@link serveMcp}. */
export interface McpServerHandle {
  /** Stops serving, and kills the sandbox if this server created it. Safe to call twice. */
  close(): Promise<void>;
  /** Settles once the server has stopped: the client closed the input, or {@link close} ran. */
  readonly closed: Promise<void>;
}

/**
 * Serves one sandbox's tools (see `sandboxTools`: its custom commands and file tools) as a Model
 * Context Protocol server over stdio, with the official SDK. A failing tool call answers with an
 * MCP tool error (`isError: true`, `{ error, type }` with the remote error class) and the server
 * goes on; it stops when the client closes its input.
 *
 * @example
 * // an MCP client config: { "command": "abx", "args": ["mcp", "--template", "base"] }
 * const server = await serveMcp({ template: 'base' });
 * await server.closed;
 */
export async function serveMcp(options: ServeMcpOptions): Promise<McpServerHandle> {
  if ((options.sandboxId === undefined) === (options.template === undefined)) {
    throw new TypeError('serveMcp needs exactly one of sandboxId and template');
  }
  // Loaded here, not at the top: importing agent-sandbox should not load the MCP SDK.
  const [{ Server }, { StdioServerTransport }, { CallToolRequestSchema, ListToolsRequestSchema }] =
    await Promise.all([
      import('@modelcontextprotocol/sdk/server/index.js'),
      import('@modelcontextprotocol/sdk/server/stdio.js'),
      import('@modelcontextprotocol/sdk/types.js'),
    ]);

  const connection = options.home === undefined ? {} : { home: options.home };

  let sandbox: Promise<Sandbox> | undefined;
  let created: Sandbox | undefined;
  const getSandbox = () => {
    sandbox ??= (async () => {
      const box = options.sandboxId
        ? await Sandbox.connect(options.sandboxId, connection)
        : await Sandbox.create({ ...connection, template: options.template as string });
      if (!options.sandboxId) created = box;
      if (options.modules?.length) await box.server.start({ modules: options.modules });
      return box;
    })();
    // A failed creation is retried by the next request rather than remembered.
    sandbox.catch(() => {
      sandbox = undefined;
    });
    return sandbox;
  };
  const tools = async (): Promise<SandboxTool[]> => (await getSandbox()).tools();

  const home =
    options.home ??
    (process.env.ABX_API_URL ? `the control plane at ${process.env.ABX_API_URL}` : abxHome());
  const which = options.sandboxId
    ? `sandbox ${options.sandboxId}`
    : `a sandbox of template '${options.template}', created on first use and killed when this server stops`;
  const server = new Server(
    { name: 'agent-sandbox', version: packageInfo().version },
    {
      capabilities: { tools: {} },
      // Says which installation answers, so a client started without ABX_HOME is not a mystery.
      instructions: `Tools that run in ${which}: an isolated Linux machine (agent-sandbox). Installation: ${home}.`,
    },
  );
  server.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: (await tools()).map(mcpToolInfo),
  }));
  server.setRequestHandler(CallToolRequestSchema, async (request) => {
    const { name, arguments: args } = request.params;
    try {
      const tool = (await tools()).find((t) => t.name === name);
      if (!tool) {
        return mcpFailure({
          message: `no tool '${name}' in this sandbox`,
          type: 'ToolNotFoundError',
        });
      }
      return mcpSuccess(await tool.invoke(args ?? {}));
    } catch (error) {
      return mcpFailure(toToolCallError(name, error));
    }
  });

  const input = options.input ?? process.stdin;
  const transport = new StdioServerTransport(input, options.output ?? process.stdout);
  let resolveClosed: () => void = () => undefined;
  const closed = new Promise<void>((resolve) => {
    resolveClosed = resolve;
  });
  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= (async () => {
      input.off('end', onEnd);
      await server.close().catch(() => undefined);
      // Kill only what this server created; a sandbox named by id belongs to someone else.
      await sandbox?.catch(() => undefined);
      await created?.kill().catch(() => undefined);
      resolveClosed();
    })();
    return closing;
  };
  // The SDK's stdio transport does not notice the client closing stdin; this is how MCP clients
  // ask a stdio server to stop.
  const onEnd = () => void close();
  input.on('end', onEnd);
  server.onclose = () => void close();
  await server.connect(transport);
  return { close, closed };
}
