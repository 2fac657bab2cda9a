import { BaseChatModel } from '@langchain/core/language_models/chat_models';
import { AIMessage, type BaseMessage } from '@langchain/core/messages';
import type { ChatResult } from '@langchain/core/outputs';

/** One tool call of a scripted turn: `[tool, args]`. */
export type ScriptedCall = [name: string, args: Record<string, unknown>];

/**
 * A LangChain chat model that plays a script: turn n answers with the tool calls of `turns[n]`
 * (all in one message, as a model calling tools in parallel), then with `finalText` and no calls,
 * which ends the agent loop. It records the messages of every turn. @langchain/core's testing
 * models either answer text only (FakeListChatModel) or repeat one answer
 * (FakeStreamingChatModel); an agent needs a different tool call per turn.
 */
export class ScriptedChatModel extends BaseChatModel {
  /** The messages the model was given, one list per turn. */
  readonly seen: BaseMessage[][] = [];
  private calls = 0;

  constructor(
    private readonly turns: ScriptedCall[][],
    private readonly finalText = 'done',
  ) {
    super({});
  }

  _llmType(): string {
    return 'scripted';
  }

  // deepagents binds its tools to the model; the script already knows which it calls.
  override bindTools(): this {
    return this;
  }

  async _generate(messages: BaseMessage[]): Promise<ChatResult> {
    const turn = this.turns[this.seen.length];
    this.seen.push(messages);
    const message = turn
      ? new AIMessage({
          content: '',
          tool_calls: turn.map(([name, args]) => ({
            id: `call-${++this.calls}`,
            name,
            args,
            type: 'tool_call' as const,
          })),
        })
      : new AIMessage(this.finalText);
    return { generations: [{ message, text: turn ? '' : this.finalText }] };
  }
}
