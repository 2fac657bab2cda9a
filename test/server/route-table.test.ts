import { describe, expect, test } from 'vitest';
import { MethodNotAllowedError, RouteNotFoundError } from '../../runtime/server/errors.js';
import { type Route, RouteTable } from '../../runtime/server/route-table.js';

const route = (method: Route<unknown>['method'], path: string): Route<unknown> => ({
  method,
  path,
  group: 'TEST',
  summary: '',
  handler: () => null,
});

describe('RouteTable', () => {
  const table = new RouteTable([
    route('GET', '/process'),
    route('POST', '/process/exec'),
    route('GET', '/process/{id}'),
    route('POST', '/process/{id}/kill'),
    route('GET', '/commands/{name}'),
    route('POST', '/commands/{name}'),
  ]);

  test('extracts named, decoded parameters', () => {
    const { route: found, params } = table.match('POST', '/process/p%2F1/kill');
    expect(found.path).toBe('/process/{id}/kill');
    expect(params).toEqual({ id: 'p/1' });
  });

  test('a literal segment wins over a parameter', () => {
    expect(table.match('POST', '/process/exec').route.path).toBe('/process/exec');
    expect(() => table.match('GET', '/process/exec')).toThrow(MethodNotAllowedError);
  });

  test('405 names the allowed methods; 404 for an unknown path', () => {
    try {
      table.match('DELETE', '/commands/x');
      expect.unreachable();
    } catch (error) {
      expect((error as MethodNotAllowedError).allow).toEqual(['GET', 'POST']);
    }
    expect(() => table.match('GET', '/process/1/kill/now')).toThrow(RouteNotFoundError);
    expect(() => table.match('GET', '/nothing')).toThrow(RouteNotFoundError);
  });

  test('trailing and doubled slashes do not matter', () => {
    expect(table.match('GET', '/process/').route.path).toBe('/process');
    expect(table.match('GET', '//process//p1').params).toEqual({ id: 'p1' });
  });

  test('a route defined twice is refused', () => {
    expect(() => new RouteTable([route('GET', '/a'), route('GET', '/a')])).toThrow(
      'route GET /a is defined twice',
    );
  });
});
