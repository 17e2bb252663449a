'use strict';

/**
 * The local stage's deployment target: LocalStack instead of AWS. infra/serverless/plugins.cjs
 * loads this plugin for the local stage only, so no other stage's package or deploy runs it.
 *
 * Why not serverless-localstack, the plugin made for this: its 1.4.0 patches the AWS SDK v2
 * surface of the framework (provider.request, getCredentials, sdk), which osls 4 removed:
 * `osls package --stage local` with it fails with "provider.getCredentials() is no longer
 * available". osls 4 builds every AWS client it deploys with from provider.getAwsSdkV3Config(),
 * so wrapping that one method is all it takes: LocalStack's endpoint (AWS_ENDPOINT_URL, default
 * http://localhost:4566), path-style S3 (the deployment bucket needs no DNS name of its own) and
 * LocalStack's test credentials, always, so a developer's real AWS profile is never used (or
 * prompted for) by a local deploy. Packaging calls no AWS API and is unchanged.
 *
 * Before a deploy or a remove calls anything it checks that LocalStack answers, with the services
 * the stage needs (infra/localstack/health.ts), and stops with one line saying what to do if not.
 */
const path = require('node:path');
const { tsImport } = require('tsx/esm/api');

const load = (relative) => tsImport(path.join(__dirname, relative), __filename);

class LocalStackTarget {
  constructor(serverless) {
    const provider = serverless.getProvider('aws');
    const awsSdkV3Config = provider.getAwsSdkV3Config.bind(provider);
    let target;
    const resolveTarget = () => {
      target ??= load('./topology.ts').then((topology) => ({
        endpoint: process.env.AWS_ENDPOINT_URL || topology.LOCALSTACK.hostEndpoint,
        credentials: { ...topology.LOCALSTACK_CREDENTIALS },
      }));
      return target;
    };
    provider.getAwsSdkV3Config = async (options = {}) => {
      const { endpoint, credentials } = await resolveTarget();
      const config = await awsSdkV3Config({ ...options, credentials });
      return { ...config, endpoint, forcePathStyle: true };
    };
    // At `initialize`, the first step of every command: it says where this stage deploys to (a
    // package included, so no one mistakes its target), and before any AWS call of a deploy or a
    // remove checks LocalStack (never for a package, which must keep working offline).
    const command = serverless.processedInput?.commands?.[0];
    this.hooks = {
      initialize: async () => {
        const { endpoint } = await resolveTarget();
        serverless.cli?.log?.(
          `deploys of this stage go to LocalStack at ${endpoint} (infra/localstack/osls-plugin.cjs)`,
        );
        if (command !== 'deploy' && command !== 'remove') return;
        const { checkLocalStack } = await load('./health.ts');
        const health = await checkLocalStack(endpoint);
        serverless.cli?.log?.(
          `LocalStack ${health.version ?? '(version not reported)'} answers at ${endpoint}`,
        );
      },
    };
  }
}

module.exports = LocalStackTarget;
