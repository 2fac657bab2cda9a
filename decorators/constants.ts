/** Every metadata key the decorators write, in one place. */
export const SANDBOX_CLASS_KEY = 'agent-sandbox:class';
export const REGISTERED_METHODS_KEY = 'agent-sandbox:methods';
export const PARAMETER_OVERRIDES_KEY = 'agent-sandbox:parameters';

/** Written by TypeScript (`emitDecoratorMetadata`), read by the builder. */
export const DESIGN_PARAMTYPES_KEY = 'design:paramtypes';

/** The template a class belongs to when `@sandbox` is used bare. */
export const DEFAULT_TEMPLATE = 'base';
