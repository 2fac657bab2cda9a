import type { Command } from 'commander';
import { serveMcp } from '../mcp/serve-mcp.js';
import { UsageError } from './errors.js';
import { collect, withExamples } from './options.js';

interface McpOptions {
  template?: string;
  module?: string[];
}

async function mcp(id: string | undefined, options: McpOptions): Promise<void> {
  if ((id === undefined) === (options.template === undefined)) {
    throw new UsageError('give a sandbox id or --template, not both or neither', 'abx mcp --help');
  }
  const server = await serveMcp({
    ...(id === undefined ? { template: options.template as string } : { sandboxId: id }),
    ...(options.module ? { modules: options.module } : {}),
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
        '-m, --module <file>',
        'a compiled JS module whose @sandbox classes to serve as tools (repeatable)',
        collect,
      )
      .action(mcp),
    'abx mcp --template base',
    '{ "mcpServers": { "sandbox": { "command": "abx", "args": ["mcp", "--template", "base"] } } }',
  );
}
