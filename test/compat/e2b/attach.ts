import { Sandbox as E2bSandbox } from 'e2b';

/** The envd version the daemon's E2B control API announces (docs/e2b.md). */
export const ENVD_VERSION = '0.6.4';

type E2bOptions = {
  sandboxId: string;
  envdVersion: string;
  envdAccessToken?: string;
  sandboxUrl: string;
  apiKey: string;
};

/**
 * An `e2b` Sandbox attached to an existing abx sandbox through the gateway (E2B_SANDBOX_URL
 * mode), built as its `Sandbox.connect` builds it but without the control API call: the E2B
 * control API is another slice, and these tests are about envd's face.
 */
export function attach(gateway: string, sandboxId: string, token: string): E2bSandbox {
  const Ctor = E2bSandbox as unknown as new (opts: E2bOptions) => E2bSandbox;
  return new Ctor({
    sandboxId,
    envdVersion: ENVD_VERSION,
    envdAccessToken: token,
    sandboxUrl: gateway,
    apiKey: 'e2b_unused',
  });
}
