import { expect, test } from 'vitest';
import { int, listCommands, sandbox } from '../src/index.js';

test('smoke', () => {
  @sandbox('data-tools')
  class DataTools {
    @sandbox.register
    summarize(path: string, @int top: number = 10, verbose = false) {
      return { path, top, verbose };
    }
  }
  console.log(JSON.stringify(listCommands('data-tools'), null, 1), DataTools.name);
  expect(1).toBe(1);
});
