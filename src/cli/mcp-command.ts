import { resolve } from 'node:path';
import type { Command } from 'commander';
import { findDaemon, runningDaemons } from '../installation/daemon-connection.js';
import { abxHome } from '../installation/paths.js';
import { serveMcp } from '../mcp/serve-mcp.js';
import { UsageError } from './errors.js';
import { collect, withExamples } from './options.js';

interface McpOptions {
  template?: string;
  module?: string[];
  home?: string;
}

/**
 * The installation to serve from. MCP clients start servers with a clean environment, so a home
 * the user set with `ABX_HOME` in their shell never arrives: when the home is only the default
 * and no daemon runs there while others do, starting one there would be an accident. Refuse and
 * name the homes that do have a daemon.
 */
async function chooseHome(options: McpOptions): Promise<string> {
  const home = options.home === undefined ? abxHome() : resolve(options.home);
  if (options.home !== undefined || process.env.ABX_HOME || (await findDaemon(home))) return home;
  const others = runningDaemons().filter((daemon) => daemon.home !== home);
  if (others.length === 0) return home;
  const list = others.map((daemon) => `${daemon.home} (pid ${daemon.pid})`).join(', ');
  throw new UsageError(
    `no daemon runs under the default home ${home}, but one does under ${list}; MCP clients start servers without your shell's ABX_HOME, so pass --home ${(others[0] as { home: string }).home} (or "env": { "ABX_HOME": ... } in the MCP config) rather than start a second daemon`,
    'abx mcp --help',
  );
}

async function mcp(id: string | undefined, options: McpOptions): Promise<void> {
  if ((id === undefined) === (options.template === undefined)) {
    throw new UsageError('give a sandbox id or --template, not both or neither', 'abx mcp --help');
  }
  // A remote control plane (ABX_API_URL, --api-url) has no local home to choose.
  const remote = options.home === undefined && Boolean(process.env.ABX_API_URL);
  const server = await serveMcp({
    ...(id === undefined ? { template: options.template as string } : { sandboxId: id }),
    ...(options.module ? { modules: options.module } : {}),
    ...(remote ? {} : { home: await chooseHome(options) }),
  });
  // An MCP client stops a stdio server by closing stdin, or by a signal when that is not enough:
  // either way a sandbox created for this session must not outlive it.
  const stop = () => void server.close();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  try {
    await server.closed;
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
  }
}

/** `abx mcp ID | --template T`: a sandbox's tools as a Model Context Protocol server on stdio. */
export function addMcpCommand(program: Command): void {
  withExamples(
    program
      .command('mcp')
      .description(
        "Serve a sandbox's custom commands and file tools as an MCP server over stdio. With --template, a sandbox is created on first use and killed on exit.",
      )
      .argument('[id]', 'a running sandbox (left running on exit)')
      .option('-t, --template <name>', 'create a sandbox from this template instead')
      .option(
        '--home <path>',
        'the installation ($ABX_HOME) to use; MCP clients do not pass your shell environment on',
      )
      .option(
        '-m, --module <file>',
        'a compiled JS module whose @sandbox classes to serve as tools (repeatable)',
        collect,
      )
      .action(mcp),
    'abx mcp --template base',
    '{ "mcpServers": { "sandbox": { "command": "abx", "args": ["mcp", "--template", "base", "--home", "/home/me/.abx"] } } }',
  );
}
