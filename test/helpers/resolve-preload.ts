import { writeFileSync } from 'node:fs';

/**
 * Writes a preload (`node -r FILE`) that answers DNS lookups of `domain` and every name below it
 * with `address`: the wildcard record an operator would add, for clients in tests (nothing
 * resolves names on this machine). Other names are looked up as usual.
 */
export function writeResolvePreload(file: string, domain: string, address: string): string {
  const pattern = `(^|\\.)${domain.replaceAll('.', '\\.')}$`;
  writeFileSync(
    file,
    `const dns = require('node:dns');
const lookup = dns.lookup;
dns.lookup = function (host, options, callback) {
  if (typeof options === 'function') { callback = options; options = {}; }
  if (/${pattern}/.test(host)) {
    return options.all ? callback(null, [{ address: ${JSON.stringify(address)}, family: 4 }]) : callback(null, ${JSON.stringify(address)}, 4);
  }
  return lookup.call(this, host, options, callback);
};
`,
  );
  return file;
}
