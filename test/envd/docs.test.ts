import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { expect, test } from 'vitest';
import { ARCHIVE } from '../../runtime/envd/archive.js';
import { codeGroup } from '../../runtime/envd/code.js';
import { ENV } from '../../runtime/envd/env.js';
import { EXEC } from '../../runtime/envd/exec.js';
import { FILES_BATCH } from '../../runtime/envd/files-batch.js';
import { portsGroup } from '../../runtime/envd/ports.js';
import { logsGroup } from '../../runtime/envd/sandbox-log.js';
import { ServerStarter, serverStartGroup } from '../../runtime/envd/server-start.js';
import { tokensGroup } from '../../runtime/envd/tokens.js';
import { watchGroup } from '../../runtime/envd/watch.js';
import { ROOT } from '../server/harness.js';

const doc = readFileSync(join(ROOT, 'docs', 'envd-api.md'), 'utf8');

test('docs/envd-api.md lists exactly the envd-only routes, each with its group and summary', () => {
  const start = doc.indexOf('## Endpoints');
  const documented = doc
    .slice(start, doc.indexOf('\n## ', start + 1))
    .split('\n')
    .filter((line) => line.startsWith('|') && !/^\|[\s|:-]+\|$/.test(line))
    .slice(1)
    .map((line) => {
      const [method, path, group, summary] = line
        .slice(1, -1)
        .split('|')
        .map((cell) => cell.trim());
      return `${method} ${path?.replace(/^`|`$/g, '')} ${group}: ${summary}`;
    })
    .sort();
  // Defining the group opens nothing: forwarders start only when a route is called.
  const routes = [
    ...EXEC.routes,
    ...portsGroup('/nonexistent').routes,
    ...serverStartGroup(new ServerStarter('/nonexistent/server.cjs')).routes,
    ...FILES_BATCH.routes,
    ...watchGroup().routes,
    ...ARCHIVE.routes,
    ...ENV.routes,
    ...tokensGroup(() => undefined).routes,
    ...codeGroup({ driversDir: '/nonexistent' }).routes,
    ...logsGroup().routes,
  ]
    .map((r) => `${r.method} ${r.path} ${r.group}: ${r.summary}`)
    .sort();
  expect(documented).toEqual(routes);
});
