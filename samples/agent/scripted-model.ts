// A stand-in for an LLM: it answers from a script, so the sample runs offline and in CI. A real
// model takes the same messages and tools and gives the same kind of turn; see agent-loop.ts.
import type { JsonValue } from 'abx-sandbox';

/** A tool call a model asks for. */
export interface ToolCall {
  id: string;
  name: string;
  args: Record<string, unknown>;
}

/** One message of the conversation, in a provider-neutral shape. */
export type Message =
  | { role: 'user'; content: string }
  | { role: 'assistant'; content: string; toolCalls: ToolCall[] }
  | { role: 'tool'; toolCallId: string; content: JsonValue };

/** What the loop needs of a model: the next assistant message for a conversation. */
export interface Model {
  next(messages: readonly Message[]): Promise<Extract<Message, { role: 'assistant' }>>;
}

const CSV = 'name,city\nada,london\ngrace,new york\nalan,london\n';

/** The last tool result of the conversation. */
function lastResult(messages: readonly Message[]): JsonValue | undefined {
  const last = messages.at(-1);
  return last?.role === 'tool' ? last.content : undefined;
}

/**
 * A model that works through a fixed plan: write a CSV file, count its lines with the template's
 * YAML command, rank a column with the decorated command, try a file that does not exist (to show
 * a tool error coming back as data), count the cities in Python with run_code, then answer from
 * what the tools returned.
 */
export function scriptedModel(): Model {
  const plan: ToolCall[] = [
    { id: '1', name: 'write_file', args: { file_path: 'people.csv', content: CSV } },
    { id: '2', name: 'count_lines', args: { path: 'people.csv' } },
    { id: '3', name: 'summarize', args: { path: 'people.csv', column: 'city', top: 1 } },
    { id: '4', name: 'read_file', args: { file_path: 'missing.csv' } },
    {
      id: '5',
      name: 'run_code',
      args: {
        code: "import csv\nrows = list(csv.DictReader(open('people.csv')))\nlen({r['city'] for r in rows})",
      },
    },
  ];
  let step = 0;
  let summary: JsonValue | undefined;
  let cities: string | undefined;
  return {
    async next(messages) {
      if (step === 3) summary = lastResult(messages);
      if (step === 5)
        cities = (lastResult(messages) as { results?: { text?: string }[] })?.results?.[0]?.text;
      const call = plan[step++];
      if (call) return { role: 'assistant', content: '', toolCalls: [call] };
      const top = (summary as { top?: { value: string; count: number }[] } | undefined)?.top?.[0];
      return {
        role: 'assistant',
        content: `Most people live in ${top?.value} (${top?.count} of them), of ${cities} cities.`,
        toolCalls: [],
      };
    },
  };
}
