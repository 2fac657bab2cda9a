// A sandbox's tools in an agent loop: the model asks for tool calls, the loop runs them in the
// sandbox and hands the results (or { error, type }) back, until the model answers in text.
// The model here is scripted, so this runs offline; plug a real one in where `model` is made.
import 'reflect-metadata';
import { fileURLToPath } from 'node:url';
import { callTool, Sandbox, Templates, toOpenAITools } from 'abx-sandbox';
import { DataTools } from '../data-tools.js';
import { type Message, scriptedModel } from './scripted-model.js';

const template = await Templates.build(
  fileURLToPath(new URL('../../template.yaml', import.meta.url)),
);
const sandbox = await Sandbox.create({ template: template.name, timeoutMs: 120_000 });
try {
  await sandbox.server.start({ commands: [DataTools] });
  // YAML commands, decorated commands and the file tools, each with a JSON Schema.
  const tools = await sandbox.tools();
  console.log(`tools: ${tools.map((t) => t.name).join(', ')}`);

  // A real model goes here, e.g. with the OpenAI SDK:
  //   const response = await openai.chat.completions.create({
  //     model: 'gpt-4.1', messages, tools: toOpenAITools(tools) });
  // and its `tool_calls` become ToolCalls (toAnthropicTools / toVercelAITools for the others).
  console.log(`openai tool format: ${JSON.stringify(toOpenAITools(tools)[0]?.function.name)}`);
  const model = scriptedModel();

  const messages: Message[] = [{ role: 'user', content: 'Where do most people in my CSV live?' }];
  for (let turn = 0; turn < 10; turn++) {
    const reply = await model.next(messages);
    messages.push(reply);
    if (reply.toolCalls.length === 0) {
      console.log(`answer: ${reply.content}`);
      break;
    }
    for (const call of reply.toolCalls) {
      // callTool never throws: a failed call is data the model can read and react to.
      const outcome = await callTool(tools, call.name, call.args);
      const content = outcome.ok ? outcome.result : { error: outcome.error, type: outcome.type };
      console.log(`${call.name} ${JSON.stringify(call.args)} -> ${JSON.stringify(content)}`);
      messages.push({ role: 'tool', toolCallId: call.id, content });
    }
  }
} finally {
  await sandbox.kill();
}
