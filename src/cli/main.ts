#!/usr/bin/env node
import 'reflect-metadata';

// Imported after the polyfill on purpose: a static import would be hoisted above it.
const { runCli } = await import('./program.js');
process.exitCode = await runCli(process.argv);
