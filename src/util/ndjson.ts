/** The parsed lines of an NDJSON body (newline-delimited JSON), as they arrive. */
export async function* ndjsonLines<T = unknown>(
  body: AsyncIterable<Uint8Array>,
): AsyncGenerator<T> {
  const decoder = new TextDecoder();
  let pending = '';
  for await (const chunk of body) {
    pending += decoder.decode(chunk, { stream: true });
    const lines = pending.split('\n');
    pending = lines.pop() ?? '';
    for (const line of lines) if (line.trim() !== '') yield JSON.parse(line) as T;
  }
}
