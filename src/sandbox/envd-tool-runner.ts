import type {
  ToolAnswer,
  ToolName,
  ToolRequest,
} from '../../runtime/server/file-tools/protocol.js';
import type { ToolOutcome, ToolRunner } from '../agent/tool-runner.js';
import type { HttpClient } from './http-client.js';

/**
 * {@link BaseSandbox}'s file tools answered by envd (`POST /files/tools/{tool}`, FILE_OPS): one
 * HTTP round trip, no process and no Node.js needed in the sandbox, and the same answers as the
 * execute() path, whose programs run the same code. Request fields left `null` are left out
 * (the routes' defaults mean the same). A failure to reach envd throws, as the contract wants.
 */
export function envdToolRunner(envd: HttpClient): ToolRunner {
  return {
    async run<N extends ToolName>(tool: N, request: ToolRequest<N>): Promise<ToolOutcome<N>> {
      const body = Object.fromEntries(
        Object.entries(request).filter(([, value]) => value !== null && value !== undefined),
      );
      return {
        ok: true,
        value: await envd.json<ToolAnswer<N>>('POST', `/files/tools/${tool}`, { body }),
      };
    },
  };
}
