import { describe, expect, test } from 'vitest';
import { LineCounter, parseDocument } from 'yaml';
import { TemplateReader } from '../../src/commands/template-reader.js';
import { readRuntime } from '../../src/commands/template-runtime.js';
import {
  parseHostRules,
  placeholderNames,
  ruleHeaders,
  rulesFor,
} from '../../src/egress/header-rules.js';
import { normalizePolicy, PolicyError } from '../../src/egress/policy.js';

/** The rule data alone: what is accepted, how a host finds its rules, how values are put in. */
describe('header rules', () => {
  const bearer = (value: string) => [{ transform: { headers: { Authorization: value } } }];

  test('hosts are written canonically and kept with the policy; an empty object is none', () => {
    const policy = normalizePolicy({
      allowOut: [],
      denyOut: [],
      rules: { 'API.Example.com.': bearer('Bearer ${secrets.openai}') } as never,
    });
    expect(policy.rules).toEqual({ 'api.example.com': bearer('Bearer ${secrets.openai}') });
    expect(normalizePolicy({ allowOut: [], denyOut: [], rules: {} }).rules).toBeUndefined();
  });

  test('bad rules are refused naming the part', () => {
    const refused = (rules: unknown) => {
      try {
        parseHostRules(rules);
      } catch (error) {
        expect(error).toBeInstanceOf(PolicyError);
        return (error as Error).message;
      }
      return 'accepted';
    };
    expect(refused({ '10.0.0.1': bearer('x') })).toContain("'10.0.0.1' is not a domain name");
    expect(refused({ 'a.test': bearer('${secrets.bad name}') })).toContain(
      "'${secrets.bad name}' is not a placeholder",
    );
    expect(refused({ 'a.test': bearer('${e2b.identity.tokens.aws}') })).toContain(
      'workload identity tokens are not supported',
    );
    expect(refused({ 'a.test': bearer('a\r\nX-Evil: 1') })).toContain('CR, LF');
    expect(refused({ 'a.test': [{ transform: { headers: { Host: 'b.test' } } }] })).toContain(
      'set by the proxy itself',
    );
    expect(refused({ 'a.test': [{ transform: { body: 'x' } }] })).toContain(
      "['a.test'][0].transform.body is not supported",
    );
    expect(refused({ 'a.test': 'x' })).toContain('must be an array');
  });

  test('an exact host wins, then the longest wildcard; a wildcard is not its apex', () => {
    const rules = parseHostRules({
      'api.example.com': bearer('exact'),
      '*.example.com': bearer('short'),
      '*.eu.example.com': bearer('long'),
    });
    const value = (host: string) => rulesFor(rules, host)?.[0]?.transform?.headers?.Authorization;
    expect(value('api.example.com')).toBe('exact');
    expect(value('x.example.com')).toBe('short');
    expect(value('x.eu.example.com')).toBe('long');
    expect(value('example.com')).toBeUndefined();
    expect(value('notexample.com')).toBeUndefined();
  });

  test('placeholders resolve once, in either spelling; a value holding placeholder text stays as it is', () => {
    const rules = parseHostRules({
      'a.test': [
        { transform: { headers: { Authorization: 'Bearer ${secrets.OpenAI}', 'X-A': 'one' } } },
        { transform: { headers: { 'x-a': '${e2b.secrets.other}-${secrets.openai}' } } },
      ],
    })?.['a.test'] as never;
    expect(placeholderNames(rules)).toEqual(['openai', 'other']);
    const headers = ruleHeaders(
      rules,
      new Map([
        ['openai', 'sk-1'],
        ['other', '${secrets.openai}'],
      ]),
    );
    expect(headers).toEqual({ authorization: 'Bearer sk-1', 'x-a': '${secrets.openai}-sk-1' });
  });
});

describe('header rules in template.yaml', () => {
  const read = (yaml: string) => {
    const lines = new LineCounter();
    const doc = parseDocument(yaml, { lineCounter: lines });
    const reader = new TemplateReader('template.yaml', doc, lines);
    const runtime = readRuntime(reader, doc.toJS() as Record<string, unknown>, '/tmp');
    return { runtime, problems: reader.problems.map((p) => p.text) };
  };

  test('network.rules is read with the lists, placeholders kept as written', () => {
    const { runtime, problems } = read(
      'name: t\nnetwork:\n  allow_out: [a.test]\n  rules:\n    a.test:\n      - transform: { headers: { Authorization: "Bearer ${secrets.tok}" } }\n',
    );
    expect(problems).toEqual([]);
    expect(runtime.egress?.rules).toEqual({
      'a.test': [{ transform: { headers: { Authorization: 'Bearer ${secrets.tok}' } } }],
    });
  });

  test('a bad rule is a problem naming it', () => {
    const { problems } = read(
      'name: t\nnetwork:\n  rules:\n    a.test:\n      - transform: { headers: { Host: b.test } }\n',
    );
    expect(problems.join('\n')).toContain('set by the proxy itself');
  });
});
