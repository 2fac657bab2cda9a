// The reflect-metadata polyfill, loaded by the package itself before anything else (first import
// of index.ts, authoring.ts and the decorators): a class decorated with this package's decorators
// imports them, so the polyfill is in place before TypeScript's emitted `__metadata` calls run.
// A user who also imports 'reflect-metadata' gets the same global (the polyfill installs once).
import 'reflect-metadata';
