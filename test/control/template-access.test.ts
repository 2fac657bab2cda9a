import { describe, expect, test } from 'vitest';
import { templateBuildRefusals } from '../../src/control/template-access.js';

// What a key that is no admin may put in a template: another template's built image only as the
// base it names (E2B's fromTemplate, checked as usable before), never by giving the image itself.
const key = { keyId: 'key-1', admin: false, name: 'alice' };
const built = 'abx-template/app:1796595932742';

describe('templateBuildRefusals', () => {
  test("another template's image is refused to a key unless it is the base the build names", () => {
    const spec = { network: 'internet' as const, image: built, setup: [] };
    expect(templateBuildRefusals(key, spec)).toEqual([
      `image: ${built} (a template's own build; start from that template instead)`,
    ]);
    expect(templateBuildRefusals(key, spec, undefined, built)).toEqual([]);
    // A base names one image: a pushed copy of another template is still refused.
    const other = { ...spec, image: 'registry:5000/abx-template-other:abc' };
    expect(templateBuildRefusals(key, other, undefined, built)).toHaveLength(1);
    // The base allows the image, nothing else the key may not give.
    expect(templateBuildRefusals(key, { ...spec, network: 'host' }, undefined, built)).toEqual([
      "network: host (the daemon host's own network)",
    ]);
  });

  test('an admin key gives any image', () => {
    const admin = { keyId: 'key-0', admin: true };
    expect(templateBuildRefusals(admin, { network: 'none', image: built, setup: [] })).toEqual([]);
  });
});
