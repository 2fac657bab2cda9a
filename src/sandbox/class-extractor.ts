import { parse } from 'acorn';
import { CommandDefinitionError } from '../errors.js';

/** An acorn node, read loosely: the walker visits whatever children a node has. */
interface AstNode {
  type: string;
  start: number;
  end: number;
  [key: string]: unknown;
}

/** What one top-level statement of a module declares, uses and changes. */
interface TopStatement {
  node: AstNode;
  kind: 'import' | 'declaration' | 'export-list' | 'directive' | 'code';
  /** Module-level names it binds. */
  declares: string[];
  /** Module-level names it reads or writes, anywhere inside it (method bodies too). */
  refs: Set<string>;
  /** Free names it assigns, updates, deletes or calls a method of while it runs. */
  writes: Set<string>;
  /** Module-level names changed inside functions it defines (when those are called). */
  laterWrites: Set<string>;
  /** Its first top-level `await` (or `for await`), which a CommonJS bundle cannot run. */
  awaits?: AstNode;
}

/** A lexical scope of the walk: the names bound in it. */
interface Scope {
  names: Set<string>;
  parent?: Scope;
}

/** What walking one top-level statement found. */
interface Facts {
  refs: Set<string>;
  writes: Set<string>;
  laterWrites: Set<string>;
  awaits?: AstNode;
}

/** Helpers that tsc, swc and esbuild emit to apply decorators: `helper([...], Cls.prototype, 'm')`. */
const DECORATE_HELPER = /^_*(ts_)?decorate(Class)?$/;

/**
 * Cuts a module down to the decorated classes the command server needs, so that a script which
 * defines its command class and then uses it (top-level `await`, a `main()` call) can be bundled
 * without running the script inside the sandbox.
 *
 * `source` is the module's JavaScript (tsc's ESM or CommonJS output, or TypeScript already
 * compiled by esbuild). Returns `undefined` when the module holds nothing but imports, exports,
 * declarations and the statements that decorate them: it is then bundled whole, as written.
 * Otherwise returns the module with every top-level statement the classes do not need blanked
 * out (line and column positions are kept, so stack traces still point at the source). Kept are
 * the classes, the statements that decorate or change them, and transitively every top-level
 * import, function, class and variable they use.
 *
 * Throws a {@link CommandDefinitionError} naming `module:line` when that cannot be done safely: a
 * class is not declared at the top level, or needs a value that top-level code computes with
 * `await` or changes later (so the sandbox would see something else than the script).
 *
 * `locate` names the place of a line of `source` in the file the user wrote (`file:line`; a
 * source map leads from compiled JavaScript or TypeScript back to it).
 */
export function extractCommandClasses(
  file: string,
  source: string,
  classNames: readonly string[],
  locate: (line: number) => string = (line) => `${file}:${line}`,
): string | undefined {
  const program = parseModule(file, source);
  const statements = (program.body as AstNode[]).map(describe);
  const declaring = new Map<string, TopStatement[]>();
  for (const statement of statements) {
    for (const name of statement.declares) {
      declaring.set(name, [...(declaring.get(name) ?? []), statement]);
    }
  }
  if (statements.every((s) => declarative(s, declaring))) return undefined;

  const at = (node: AstNode) => locate(lineAt(source, node.start));
  const cannot = (node: AstNode, cls: string) =>
    `${at(node)}: cannot bundle ${cls || 'the command classes'} for the sandbox without running this script there:`;
  // Imports cannot be reassigned, and a module imported into the sandbox starts afresh there:
  // calling `Templates.build()` at the top level changes nothing the class sees.
  const changeable = (name: string) =>
    declaring.get(name)?.some((statement) => statement.kind !== 'import') ?? false;

  // Why each statement is kept: the class it serves, and the name that made it needed.
  const kept = new Map<TopStatement, { cls: string; name: string; how: 'declares' | 'changes' }>();
  const keptNames = new Map<string, string>();
  const keep = (
    statement: TopStatement,
    cls: string,
    name: string,
    how: 'declares' | 'changes',
  ) => {
    if (kept.has(statement)) return false;
    kept.set(statement, { cls, name, how });
    for (const declared of statement.declares) {
      if (!keptNames.has(declared)) keptNames.set(declared, cls);
    }
    return true;
  };
  for (const cls of classNames) {
    const roots = declaring.get(cls);
    if (!roots) {
      const nested = findClass(program, cls);
      throw new CommandDefinitionError(
        `${nested ? at(nested) : file}: cannot bundle ${cls} for the sandbox: it is not declared at the top level of its module, whose other top-level code must not run in the sandbox. ${FIX}`,
      );
    }
    for (const root of roots) keep(root, cls, cls, 'declares');
  }
  for (const statement of statements) {
    if (
      statement.kind === 'directive' ||
      (statement.kind === 'import' && !statement.declares.length)
    ) {
      keep(statement, '', '', 'declares');
    }
  }
  for (let grew = true; grew; ) {
    grew = false;
    for (const [statement, { cls }] of [...kept]) {
      for (const name of statement.refs) {
        for (const declaration of declaring.get(name) ?? []) {
          grew = keep(declaration, cls, name, 'declares') || grew;
        }
      }
    }
    // Statements that decorate or change what is kept run in the sandbox too, in source order.
    for (const statement of statements) {
      if (kept.has(statement)) continue;
      const changed = [...statement.writes].find((n) => keptNames.has(n) && changeable(n));
      if (changed) grew = keep(statement, keptNames.get(changed) ?? '', changed, 'changes') || grew;
    }
  }

  for (const statement of statements) {
    const why = kept.get(statement);
    if (why && statement.awaits) {
      const what =
        why.how === 'changes'
          ? `it uses \`${why.name}\`, which this top-level code changes after an await`
          : why.name === why.cls
            ? `${why.cls} itself is defined with an await`
            : `it uses \`${why.name}\`, which this top-level code computes with an await`;
      throw new CommandDefinitionError(`${cannot(statement.awaits, why.cls)} ${what}. ${FIX}`);
    }
    if (why) continue;
    const changed = [...statement.laterWrites].find((n) => keptNames.has(n) && changeable(n));
    if (!changed) continue;
    const unused =
      statement.kind === 'declaration' &&
      statement.declares.every((name) =>
        statements.every((other) => other === statement || !other.refs.has(name)),
      );
    if (unused) continue;
    throw new CommandDefinitionError(
      `${cannot(statement.node, keptNames.get(changed) ?? '')} it uses \`${changed}\`, which this top-level code changes, and the sandbox would not see that change. ${FIX}`,
    );
  }

  // `exports.X = X` of tsc's CommonJS output, for the names kept.
  for (const statement of statements) {
    if (kept.has(statement) || statement.awaits || statement.kind !== 'code') continue;
    const exporting =
      statement.writes.size > 0 &&
      [...statement.writes].every((n) => n === 'exports' || n === 'module') &&
      [...statement.refs].every((n) => !declaring.has(n) || keptNames.has(n));
    if (exporting) keep(statement, '', '', 'declares');
  }

  let code = source;
  // Keeps line and column positions: stack traces and esbuild's messages still point at the source.
  const replace = (node: AstNode, text: string) => {
    const old = code.slice(node.start, node.end);
    const blank = text
      ? text + '\n'.repeat((old.match(/\n/g) ?? []).length)
      : old.replace(/[^\n]/g, ' ');
    code = code.slice(0, node.start) + blank + code.slice(node.end);
  };
  // From the end, so that earlier offsets stay valid.
  for (const statement of [...statements].reverse()) {
    if (kept.has(statement)) continue;
    if (statement.kind !== 'export-list') {
      replace(statement.node, '');
      continue;
    }
    const names = exportedLocals(statement.node).filter(([local]) => keptNames.has(local));
    if (names.length === 0) replace(statement.node, '');
    else if (statement.node.type !== 'ExportDefaultDeclaration') {
      const list = names.map(([local, exported]) =>
        local === exported ? local : `${local} as ${exported}`,
      );
      replace(statement.node, `export { ${list.join(', ')} };`);
    }
  }
  return code;
}

const FIX =
  'Move the class (with what it uses) into a module of its own and import it from this script, or move this code into a function the class does not use.';

function parseModule(file: string, source: string): AstNode {
  const options = {
    ecmaVersion: 'latest',
    allowAwaitOutsideFunction: true,
    allowHashBang: true,
    allowReturnOutsideFunction: false,
  } as const;
  try {
    return parse(source, { ...options, sourceType: 'module' }) as unknown as AstNode;
  } catch (moduleError) {
    try {
      // Sloppy-mode CommonJS (a `with`, octal literals) is no module but still a script.
      return parse(source, { ...options, sourceType: 'script' }) as unknown as AstNode;
    } catch {
      const { loc, message } = moduleError as { loc?: { line: number }; message: string };
      throw new CommandDefinitionError(
        `${file}${loc ? `:${loc.line}` : ''}: cannot read this module to bundle its command classes: ${message}`,
        { cause: moduleError },
      );
    }
  }
}

function lineAt(source: string, offset: number): number {
  let line = 1;
  for (let i = source.indexOf('\n'); i !== -1 && i < offset; i = source.indexOf('\n', i + 1)) {
    line++;
  }
  return line;
}

/** Whether a module made only of such statements may be bundled whole, as before. */
function declarative(statement: TopStatement, declaring: Map<string, TopStatement[]>): boolean {
  if (statement.awaits) return false;
  if (statement.kind !== 'code') return true;
  // `Cls = __decorate(...)`, `Cls.prototype.x = ...`, `exports.X = X`, `Object.defineProperty(exports, ...)`.
  return (
    statement.node.type === 'ExpressionStatement' &&
    statement.writes.size > 0 &&
    [...statement.writes].every((n) => declaring.has(n) || n === 'exports' || n === 'module')
  );
}

function describe(node: AstNode): TopStatement {
  const statement = (kind: TopStatement['kind'], declares: string[], scan: AstNode[]) => {
    const facts: Facts = { refs: new Set(), writes: new Set(), laterWrites: new Set() };
    for (const part of scan) walk(part, undefined, facts, false);
    return { node, kind, declares, ...facts };
  };
  switch (node.type) {
    case 'ImportDeclaration':
      return statement(
        'import',
        (node.specifiers as AstNode[]).map((s) => identifierName(s.local)),
        [],
      );
    case 'ExportAllDeclaration':
      return statement('import', [], []);
    case 'ExportNamedDeclaration': {
      if (node.source) return statement('import', [], []);
      const declaration = node.declaration as AstNode | null;
      if (declaration) return { ...describe(declaration), node };
      return statement('export-list', [], node.specifiers as AstNode[]);
    }
    case 'ExportDefaultDeclaration': {
      const declaration = node.declaration as AstNode;
      if (declaration.type === 'Identifier') return statement('export-list', [], [declaration]);
      if (
        (declaration.type === 'ClassDeclaration' || declaration.type === 'FunctionDeclaration') &&
        declaration.id
      ) {
        return { ...describe(declaration), node };
      }
      return statement('code', [], [declaration]);
    }
    case 'FunctionDeclaration':
    case 'ClassDeclaration':
      return statement('declaration', node.id ? [identifierName(node.id)] : [], [node]);
    case 'VariableDeclaration': {
      const declarations = node.declarations as AstNode[];
      const names = declarations.flatMap((d) => boundNames(d.id as AstNode));
      const init = declarations[0]?.init as AstNode | undefined;
      // `const x_1 = require('x')`: tsc's CommonJS form of an import.
      const kind = declarations.length === 1 && init && isRequire(init) ? 'import' : 'declaration';
      return statement(kind, names, [node]);
    }
    case 'ExpressionStatement':
      if (typeof node.directive === 'string') return statement('directive', [], []);
      if (isRequire(node.expression as AstNode)) return statement('import', [], []);
      return statement('code', [], [node]);
    default:
      return statement('code', [], [node]);
  }
}

/** `require('x')`, or a helper around it: `__importDefault(require('x'))`, `tslib.__importStar(...)`. */
function isRequire(node: AstNode): boolean {
  if (node.type !== 'CallExpression') return false;
  const callee = node.callee as AstNode;
  const args = node.arguments as AstNode[];
  if (callee.type === 'Identifier' && callee.name === 'require') {
    return args.length === 1 && args[0]?.type === 'Literal';
  }
  return args.length === 1 && args[0] !== undefined && isRequire(args[0]);
}

function identifierName(node: unknown): string {
  return (node as { name: string }).name;
}

/** `[local, exported]` of `export { a, b as c }` and `export default a`. */
function exportedLocals(node: AstNode): [string, string][] {
  if (node.type === 'ExportDefaultDeclaration') {
    return [[identifierName(node.declaration), 'default']];
  }
  return (node.specifiers as AstNode[]).map((s) => {
    const exported = s.exported as AstNode;
    return [
      identifierName(s.local),
      exported.type === 'Literal' ? String(exported.value) : identifierName(exported),
    ];
  });
}

/** The names a binding pattern (`a`, `{ a, b: [c] }`, `...d`, `e = 1`) binds. */
function boundNames(pattern: AstNode | null | undefined): string[] {
  if (!pattern) return [];
  switch (pattern.type) {
    case 'Identifier':
      return [identifierName(pattern)];
    case 'ObjectPattern':
      return (pattern.properties as AstNode[]).flatMap((p) =>
        boundNames((p.type === 'RestElement' ? p.argument : p.value) as AstNode),
      );
    case 'ArrayPattern':
      return (pattern.elements as (AstNode | null)[]).flatMap((e) => boundNames(e));
    case 'RestElement':
      return boundNames(pattern.argument as AstNode);
    case 'AssignmentPattern':
      return boundNames(pattern.left as AstNode);
    default:
      return [];
  }
}

/** Names a block binds for all of it: `let`, `const`, `class`, and functions declared in it. */
function lexicalNames(statements: AstNode[]): string[] {
  return statements.flatMap((s) => {
    const node = s.type === 'ExportNamedDeclaration' ? (s.declaration as AstNode | null) : s;
    if (!node) return [];
    if (node.type === 'VariableDeclaration' && node.kind !== 'var') {
      return (node.declarations as AstNode[]).flatMap((d) => boundNames(d.id as AstNode));
    }
    if ((node.type === 'ClassDeclaration' || node.type === 'FunctionDeclaration') && node.id) {
      return [identifierName(node.id)];
    }
    return [];
  });
}

/** `var` names anywhere in a function body, outside nested functions. */
function varNames(node: unknown, out: string[] = []): string[] {
  if (!isNode(node)) {
    if (Array.isArray(node)) for (const child of node) varNames(child, out);
    return out;
  }
  if (isFunction(node)) return out;
  if (node.type === 'VariableDeclaration' && node.kind === 'var') {
    out.push(...(node.declarations as AstNode[]).flatMap((d) => boundNames(d.id as AstNode)));
  }
  for (const key of Object.keys(node)) {
    if (key !== 'type' && key !== 'start' && key !== 'end') varNames(node[key], out);
  }
  return out;
}

function isNode(value: unknown): value is AstNode {
  return typeof value === 'object' && value !== null && typeof (value as AstNode).type === 'string';
}

function isFunction(node: AstNode): boolean {
  return (
    node.type === 'FunctionDeclaration' ||
    node.type === 'FunctionExpression' ||
    node.type === 'ArrowFunctionExpression'
  );
}

function bound(scope: Scope | undefined, id: string): boolean {
  for (let s = scope; s; s = s.parent) if (s.names.has(id)) return true;
  return false;
}

function child(scope: Scope | undefined, names: Iterable<string>): Scope {
  return { names: new Set(names), parent: scope };
}

/** The identifier at the root of `a`, `a.b.c`, `a[0].b`; none for `f().x` or `this.x`. */
function rootName(node: AstNode): string | undefined {
  let current = node;
  while (current.type === 'MemberExpression') current = current.object as AstNode;
  return current.type === 'Identifier' ? identifierName(current) : undefined;
}

function calleeName(callee: AstNode): string | undefined {
  if (callee.type === 'SequenceExpression') {
    const last = (callee.expressions as AstNode[]).at(-1);
    return last ? calleeName(last) : undefined;
  }
  if (callee.type === 'Identifier') return identifierName(callee);
  if (callee.type === 'MemberExpression' && !callee.computed)
    return identifierName(callee.property);
  return undefined;
}

/** Records what an expression changes: an assignment target, `x++`, `delete x.y`, `x.m()`. */
function noteWrite(target: AstNode, scope: Scope | undefined, facts: Facts, later: boolean) {
  const names =
    target.type === 'ObjectPattern' || target.type === 'ArrayPattern'
      ? boundNames(target)
      : [rootName(target)];
  for (const id of names) {
    if (id && !bound(scope, id)) (later ? facts.laterWrites : facts.writes).add(id);
  }
}

/**
 * Walks a top-level statement with its scopes, collecting the free names it uses (as `refs`),
 * what it changes, and whether it awaits outside any function.
 */
function walk(node: unknown, scope: Scope | undefined, facts: Facts, inFunction: boolean): void {
  if (Array.isArray(node)) {
    for (const item of node) walk(item, scope, facts, inFunction);
    return;
  }
  if (!isNode(node)) return;
  const visit = (value: unknown, s: Scope | undefined = scope, f = inFunction) =>
    walk(value, s, facts, f);
  switch (node.type) {
    case 'Identifier': {
      const id = identifierName(node);
      if (!bound(scope, id)) facts.refs.add(id);
      return;
    }
    case 'MemberExpression':
      visit(node.object);
      if (node.computed) visit(node.property);
      return;
    case 'MetaProperty':
    case 'Literal':
    case 'ThisExpression':
    case 'Super':
    case 'BreakStatement':
    case 'ContinueStatement':
    case 'PrivateIdentifier':
    case 'TemplateElement':
      return;
    case 'LabeledStatement':
      visit(node.body);
      return;
    case 'Property':
    case 'PropertyDefinition':
    case 'MethodDefinition':
      if (node.computed) visit(node.key);
      // Class fields and methods run when the class is used, not when it is defined.
      visit(node.value, scope, inFunction || node.type !== 'Property');
      return;
    case 'VariableDeclarator':
      visitPattern(node.id as AstNode, scope, facts, inFunction);
      visit(node.init);
      return;
    case 'AwaitExpression':
      if (!inFunction && !facts.awaits) facts.awaits = node;
      visit(node.argument);
      return;
    case 'ForOfStatement':
    case 'ForInStatement':
    case 'ForStatement': {
      if (node.await && !inFunction && !facts.awaits) facts.awaits = node;
      const head = (node.type === 'ForStatement' ? node.init : node.left) as AstNode | null;
      const inner = child(scope, head ? lexicalNames([head]) : []);
      if (head?.type !== 'VariableDeclaration' && node.type !== 'ForStatement' && head) {
        noteWrite(head, inner, facts, inFunction);
      }
      for (const key of ['init', 'left', 'right', 'test', 'update', 'body'])
        visit(node[key], inner);
      return;
    }
    case 'AssignmentExpression':
      noteWrite(node.left as AstNode, scope, facts, inFunction);
      if ((node.left as AstNode).type === 'Identifier') visit(node.left);
      else visitPattern(node.left as AstNode, scope, facts, inFunction, true);
      visit(node.right);
      return;
    case 'UpdateExpression':
      noteWrite(node.argument as AstNode, scope, facts, inFunction);
      visit(node.argument);
      return;
    case 'UnaryExpression':
      if (node.operator === 'delete') noteWrite(node.argument as AstNode, scope, facts, inFunction);
      visit(node.argument);
      return;
    case 'CallExpression':
    case 'NewExpression': {
      const callee = node.callee as AstNode;
      const args = node.arguments as AstNode[];
      const exporting = args.some(
        (arg) =>
          arg.type === 'Identifier' &&
          (identifierName(arg) === 'exports' || identifierName(arg) === 'module'),
      );
      if (callee.type === 'MemberExpression' && !exporting) {
        noteWrite(callee.object as AstNode, scope, facts, inFunction);
      }
      const helper = calleeName(callee);
      if (helper && DECORATE_HELPER.test(helper) && args[1]) {
        noteWrite(args[1], scope, facts, inFunction);
      }
      // `Object.defineProperty(exports, ...)`, `__exportStar(require('x'), exports)`.
      for (const arg of args) {
        if (
          arg.type === 'Identifier' &&
          (identifierName(arg) === 'exports' || identifierName(arg) === 'module')
        ) {
          noteWrite(arg, scope, facts, inFunction);
        }
      }
      visit(callee);
      visit(args);
      return;
    }
    case 'FunctionDeclaration':
    case 'FunctionExpression':
    case 'ArrowFunctionExpression': {
      const params = (node.params as AstNode[]).flatMap(boundNames);
      const own = node.type === 'FunctionExpression' && node.id ? [identifierName(node.id)] : [];
      const bodyNode = node.body as AstNode;
      const hoisted =
        bodyNode.type === 'BlockStatement'
          ? [...varNames(bodyNode.body), ...lexicalNames(bodyNode.body as AstNode[])]
          : [];
      const inner = child(scope, [...params, ...own, ...hoisted, 'arguments']);
      for (const param of node.params as AstNode[]) visitPattern(param, inner, facts, true);
      visit(bodyNode.type === 'BlockStatement' ? bodyNode.body : bodyNode, inner, true);
      return;
    }
    case 'ClassDeclaration':
    case 'ClassExpression': {
      visit(node.superClass);
      const own = node.type === 'ClassExpression' && node.id ? [identifierName(node.id)] : [];
      visit(node.body, child(scope, own));
      return;
    }
    case 'StaticBlock':
      visit(
        node.body,
        child(scope, [...varNames(node.body), ...lexicalNames(node.body as AstNode[])]),
        true,
      );
      return;
    case 'BlockStatement':
      visit(node.body, child(scope, lexicalNames(node.body as AstNode[])));
      return;
    case 'SwitchStatement': {
      visit(node.discriminant);
      const cases = node.cases as AstNode[];
      const names = lexicalNames(cases.flatMap((c) => c.consequent as AstNode[]));
      visit(cases, child(scope, names));
      return;
    }
    case 'CatchClause': {
      const inner = child(scope, boundNames(node.param as AstNode | null));
      visitPattern(node.param as AstNode | null, inner, facts, inFunction);
      visit(node.body, inner);
      return;
    }
    case 'ExportSpecifier':
      visit(node.local);
      return;
    default:
      for (const key of Object.keys(node)) {
        if (key !== 'type' && key !== 'start' && key !== 'end') visit(node[key]);
      }
  }
}

/**
 * Visits what a binding pattern evaluates (defaults, computed keys) without counting the names
 * it binds as uses; in an assignment pattern (`[a, b] = ...`) the targets are uses.
 */
function visitPattern(
  pattern: AstNode | null | undefined,
  scope: Scope | undefined,
  facts: Facts,
  inFunction: boolean,
  assigning = false,
): void {
  if (!pattern) return;
  const visit = (node: AstNode | null | undefined) =>
    visitPattern(node, scope, facts, inFunction, assigning);
  switch (pattern.type) {
    case 'Identifier':
      if (assigning) walk(pattern, scope, facts, inFunction);
      return;
    case 'ObjectPattern':
      for (const p of pattern.properties as AstNode[]) {
        if (p.type === 'RestElement') visit(p.argument as AstNode);
        else {
          if (p.computed) walk(p.key, scope, facts, inFunction);
          visit(p.value as AstNode);
        }
      }
      return;
    case 'ArrayPattern':
      for (const e of pattern.elements as (AstNode | null)[]) visit(e);
      return;
    case 'RestElement':
      visit(pattern.argument as AstNode);
      return;
    case 'AssignmentPattern':
      visit(pattern.left as AstNode);
      walk(pattern.right, scope, facts, inFunction);
      return;
    default:
      // A member expression target: `[this.a, obj.b] = ...`.
      walk(pattern, scope, facts, inFunction);
  }
}

/** A class named `cls` anywhere in the module (inside a function, say), for the error's line. */
function findClass(node: unknown, cls: string): AstNode | undefined {
  if (Array.isArray(node)) {
    for (const item of node) {
      const found = findClass(item, cls);
      if (found) return found;
    }
    return undefined;
  }
  if (!isNode(node)) return undefined;
  if (
    (node.type === 'ClassDeclaration' || node.type === 'ClassExpression') &&
    (node.id as AstNode | null)?.name === cls
  ) {
    return node;
  }
  if (
    node.type === 'VariableDeclarator' &&
    (node.id as AstNode).type === 'Identifier' &&
    identifierName(node.id) === cls
  ) {
    return node;
  }
  for (const key of Object.keys(node)) {
    if (key === 'type' || key === 'start' || key === 'end') continue;
    const found = findClass(node[key], cls);
    if (found) return found;
  }
  return undefined;
}
