// Evaluated before anything else in the package (first import of index.ts), so that a missing
// polyfill fails here with a fix instead of deep inside a decorator.
if (typeof Reflect !== 'object' || typeof Reflect.getMetadata !== 'function') {
  throw new Error(
    'agent-sandbox needs the reflect-metadata polyfill to read decorator metadata: ' +
      "install it (npm install reflect-metadata) and put `import 'reflect-metadata';` on the first " +
      'line of your entry point, before importing agent-sandbox.',
  );
}
