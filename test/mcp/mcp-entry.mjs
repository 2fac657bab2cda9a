// What an MCP client spawns in test/mcp: serveMcp over this process's stdio, with the options
// given as JSON in argv[2]. Stands in for `abx mcp` until that command is wired into the CLI.
import 'reflect-metadata';

const { serveMcp } = await import('../../dist/index.js');
const server = await serveMcp(JSON.parse(process.argv[2]));
process.once('SIGTERM', () => void server.close());
await server.closed;
// Idle keep-alive sockets to the daemon would hold the process open for a few seconds more.
process.exit(0);
