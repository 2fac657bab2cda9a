export { arg, float, int } from './arg.decorator.js';
export type { ArgOptions, RegisterOptions, SandboxOptions } from './records.js';
export type { SandboxDecorator } from './sandbox.decorator.js';
export { sandbox } from './sandbox.decorator.js';
