/** Lines longer than this are split into `N.1`, `N.2`... rows by the formatter. */
export const MAX_LINE_LENGTH = 5000;

/** Width the line number is right-aligned to. */
export const LINE_NUMBER_WIDTH = 6;

/** Where to cut `text` near `end` without splitting a surrogate pair (an emoji, say). */
function cutAt(text: string, end: number): number {
  if (end >= text.length) return text.length;
  const code = text.charCodeAt(end - 1);
  return code >= 0xd800 && code <= 0xdbff ? end - 1 : end;
}

/**
 * Adds line numbers to file content, `cat -n` style: the number right-aligned to
 * {@link LINE_NUMBER_WIDTH}, two spaces, the line. A line longer than {@link MAX_LINE_LENGTH}
 * characters becomes several rows numbered `N`, `N.1`, `N.2`... A final newline does not make an
 * extra empty row.
 *
 * @example
 * const page = await sandbox.read('/app/main.py', { offset: 10, limit: 20 });
 * formatContentWithLineNumbers(page.fileData.content, page.startLine);
 */
export function formatContentWithLineNumbers(content: string | string[], startLine = 1): string {
  const lines = typeof content === 'string' ? content.split('\n') : content;
  if (typeof content === 'string' && lines[lines.length - 1] === '') lines.pop();
  const rows: string[] = [];
  lines.forEach((line, index) => {
    const number = index + startLine;
    let start = 0;
    let part = 0;
    do {
      const end = cutAt(line, start + MAX_LINE_LENGTH);
      const label = part === 0 ? String(number) : `${number}.${part}`;
      rows.push(`${label.padStart(LINE_NUMBER_WIDTH)}  ${line.slice(start, end)}`);
      start = end;
      part += 1;
    } while (start < line.length);
  });
  return rows.join('\n');
}
