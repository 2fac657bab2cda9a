import { generateText as generateText7, isStepCount } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import {
  generateText as generateText5,
  jsonSchema as jsonSchema5,
  stepCountIs as stepCountIs5,
} from 'ai-v5';
import { MockLanguageModelV2 } from 'ai-v5/test';
import { generateText as generateText6, stepCountIs as stepCountIs6 } from 'ai-v6';
import { MockLanguageModelV3 } from 'ai-v6/test';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, type SandboxTool, toVercelAITools } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';

// The Vercel AI SDK itself (7, 6 and 5, each with its own mock model) runs an agent loop whose
// tool calls execute in a real sandbox through toVercelAITools: the scripted model writes a file,
// then runs a command and makes one bad call, then answers from what the tools returned.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let sandbox: Sandbox;
let tools: SandboxTool[];

beforeAll(async () => {
  abx = await createAbxHome();
  sandbox = await Sandbox.create({ home: abx.home });
  tools = await sandbox.tools();
}, 120_000);

afterAll(async () => {
  await sandbox?.kill().catch(() => false);
  await abx?.close();
});

// biome-ignore lint/suspicious/noExplicitAny: the prompt's messages differ by spec version
type Prompt = any[];

/** The tool results the SDK put in the prompt, as `name: output` lines. */
function toolResults(prompt: Prompt): string[] {
  return prompt
    .filter((message) => message.role === 'tool')
    .flatMap((message) => message.content)
    .filter((part) => part.type === 'tool-result')
    .map((part) => `${part.toolName}: ${JSON.stringify(part.output ?? part.result)}`);
}

const USAGE_V2 = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };
const USAGE = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** The scripted turns: tool calls first, then an answer quoting every tool result. */
function script(version: 2 | 3 | 4, file: string) {
  const finish = (reason: 'tool-calls' | 'stop') =>
    version === 2 ? reason : { unified: reason, raw: reason };
  const usage = version === 2 ? USAGE_V2 : USAGE;
  // The SDK runs one turn's calls at once: the file is written a turn before it is read.
  const turns = [
    [['write_file', { file_path: file, content: 'hello from the model\n' }]],
    [
      ['execute', { command: `wc -c < ${file} && cat ${file}` }],
      ['read_file', { offset: 'not a number' }],
    ],
  ] as const;
  let turn = 0;
  return async ({ prompt }: { prompt: Prompt }) => {
    const calls = turns[turn++];
    if (calls) {
      return {
        content: calls.map(([toolName, input], i) => ({
          type: 'tool-call' as const,
          toolCallId: `call-${turn}-${i}`,
          toolName,
          input: JSON.stringify(input),
        })),
        finishReason: finish('tool-calls'),
        usage,
        warnings: [],
      };
    }
    return {
      content: [{ type: 'text' as const, text: toolResults(prompt).join('\n') }],
      finishReason: finish('stop'),
      usage,
      warnings: [],
    };
  };
}

async function expectAnswer(text: string, file: string): Promise<void> {
  expect(text).toContain('execute: ');
  expect(text).toContain('21\\nhello from the model\\n');
  // The bad call reached the model as a tool error naming what was wrong, and the loop went on.
  expect(text).toMatch(/read_file: .*file_path/);
  expect(await sandbox.files.read(file)).toBe('hello from the model\n');
}

describe('Vercel AI SDK agent loops over toVercelAITools', () => {
  test('ai 7 (Standard Schemas)', async () => {
    const model = new MockLanguageModelV4({ doGenerate: script(4, 'ai7.txt') as never });
    const result = await generateText7({
      model,
      tools: toVercelAITools(tools),
      prompt: 'write a file and show it',
      stopWhen: isStepCount(4),
    });
    await expectAnswer(result.text, 'ai7.txt');
    // The model was offered every tool with its JSON Schema.
    const offered = model.doGenerateCalls[0]?.tools ?? [];
    expect(offered.map((t) => t.name)).toEqual(tools.map((t) => t.name));
    expect(offered.find((t) => t.name === 'execute')).toMatchObject({
      inputSchema: { type: 'object', required: ['command'] },
    });
  });

  test('ai 6 (Standard Schemas)', async () => {
    const model = new MockLanguageModelV3({ doGenerate: script(3, 'ai6.txt') as never });
    const result = await generateText6({
      model,
      tools: toVercelAITools(tools),
      prompt: 'write a file and show it',
      stopWhen: stepCountIs6(4),
    });
    await expectAnswer(result.text, 'ai6.txt');
  });

  test('ai 5 (its own jsonSchema helper)', async () => {
    const model = new MockLanguageModelV2({ doGenerate: script(2, 'ai5.txt') as never });
    const result = await generateText5({
      model,
      tools: toVercelAITools(tools, { jsonSchema: jsonSchema5 }),
      prompt: 'write a file and show it',
      stopWhen: stepCountIs5(4),
    });
    await expectAnswer(result.text, 'ai5.txt');
  });
});
