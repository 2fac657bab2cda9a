// Prints the custom commands of the data-tools template, merged from template.yaml and the
// decorated DataTools class, as a table and as the discovery document (GET /commands).
import { fileURLToPath } from 'node:url';
import { describeCommand, formatCommandTable, listCommands, loadTemplate } from 'abx-sandbox';
import './data-tools.js';

const template = loadTemplate(fileURLToPath(new URL('../template.yaml', import.meta.url)));
const commands = listCommands(template.name);

console.log(`Custom commands of template '${template.name}':\n`);
console.log(formatCommandTable(commands));
console.log('\nDiscovery document:\n');
console.log(JSON.stringify({ commands: commands.map(describeCommand) }, null, 2));
