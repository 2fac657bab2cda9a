#!/usr/bin/env node
import module from 'node:module';

// Node 22.1+ keeps the compiled code of every module it loads on disk (in the system's temporary
// folder unless NODE_COMPILE_CACHE names one): later starts skip compiling abx and its
// dependencies. Node 20 has no such cache; there the lazy loading in program.ts is what helps.
(module as { enableCompileCache?: () => unknown }).enableCompileCache?.();

// Imported after the cache is on: a static import would be hoisted above it. The reflect-metadata
// polyfill comes with the modules that need it (the decorators, the command model), not here.
const { runCli } = await import('./program.js');
process.exitCode = await runCli(process.argv);
