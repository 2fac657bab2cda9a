import { type Expression, type Node, type Pattern, type Program, parse } from 'acorn';
import type { ArgValue } from './custom-command.js';

/** What the source of a function says about one of its parameters. */
export type ParsedParameter =
  | { kind: 'identifier'; name: string; default?: ParsedDefault }
  | { kind: 'destructured'; text: string }
  | { kind: 'rest'; text: string };

/** A default value: a literal we could read, or the source text of one we could not. */
export type ParsedDefault = { literal: true; value: ArgValue } | { literal: false; text: string };

type FunctionNode = Node & { params: Pattern[] };

/**
 * Parses a function's own source text and returns its parameter list.
 *
 * `Function.prototype.toString()` of a class method is method syntax (`name(a, b = 2) {}`), which
 * is not an expression on its own; wrapped in `({ ... })` it is. Plain functions and arrows parse
 * when wrapped in parentheses.
 */
export function parseParameters(fn: (...args: never[]) => unknown): ParsedParameter[] {
  const source = Function.prototype.toString.call(fn);
  if (/\{\s*\[native code\]\s*\}$/.test(source)) {
    throw new Error('it is a native or bound function, whose parameters cannot be read');
  }
  let lastError: unknown;
  for (const text of [`(${source})`, `({${source}})`]) {
    try {
      const node = functionOf(parse(text, { ecmaVersion: 'latest' }));
      if (node) return node.params.map((param) => describeParameter(param, text));
    } catch (error) {
      lastError = error;
    }
  }
  throw new Error(`its source could not be parsed (${String(lastError ?? 'not a function')})`);
}

function functionOf(program: Program): FunctionNode | undefined {
  const statement = program.body.length === 1 ? program.body[0] : undefined;
  if (statement?.type !== 'ExpressionStatement') return undefined;
  const node = statement.expression;
  if (node.type === 'FunctionExpression' || node.type === 'ArrowFunctionExpression') return node;
  if (node.type === 'ObjectExpression' && node.properties.length === 1) {
    const property = node.properties[0];
    if (property?.type === 'Property' && property.value.type === 'FunctionExpression') {
      return property.value;
    }
  }
  return undefined;
}

function describeParameter(param: Pattern, source: string): ParsedParameter {
  const text = (node: Node) => source.slice(node.start, node.end).replace(/\s+/g, ' ');
  if (param.type === 'Identifier') return { kind: 'identifier', name: param.name };
  if (param.type === 'RestElement') return { kind: 'rest', text: text(param) };
  if (param.type === 'AssignmentPattern' && param.left.type === 'Identifier') {
    return { kind: 'identifier', name: param.left.name, default: readLiteral(param.right, text) };
  }
  return { kind: 'destructured', text: text(param) };
}

function readLiteral(node: Expression, text: (node: Node) => string): ParsedDefault {
  if (node.type === 'Literal') {
    const value = node.value;
    if (typeof value === 'string' || typeof value === 'boolean') return { literal: true, value };
    if (typeof value === 'number' && node.bigint === undefined) return { literal: true, value };
  }
  if (node.type === 'TemplateLiteral' && node.expressions.length === 0) {
    const cooked = node.quasis[0]?.value.cooked;
    if (typeof cooked === 'string') return { literal: true, value: cooked };
  }
  if (
    node.type === 'UnaryExpression' &&
    (node.operator === '-' || node.operator === '+') &&
    node.argument.type === 'Literal' &&
    typeof node.argument.value === 'number'
  ) {
    const value = node.argument.value;
    return { literal: true, value: node.operator === '-' ? -value : value };
  }
  return { literal: false, text: text(node) };
}
