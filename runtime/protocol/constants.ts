/** The port envd answers on: the gateway routes `{ENVD_PORT}-{sandboxId}.{domain}` to it. */
export const ENVD_PORT = 49983;
