'use strict';

/**
 * serverless.yml's plugin list: serverless-esbuild for every stage, and for the local stage
 * only, infra/localstack/osls-plugin.cjs, which deploys into LocalStack instead of AWS. Not loaded,
 * it cannot touch a dev or prod package or deploy (test/integration/template-local.test.ts
 * packages them with and without it and compares).
 *
 * osls resolves `plugins` before it knows the stage's other settings, so this reads the stage
 * from the command line the way provider.stage does (`${opt:stage, 'dev'}`).
 */
const LOCAL_STAGE = 'local';
const LOCAL_STAGE_PLUGIN = './infra/localstack/osls-plugin.cjs';

function pluginsFor(stage) {
  return ['serverless-esbuild', ...(stage === LOCAL_STAGE ? [LOCAL_STAGE_PLUGIN] : [])];
}

module.exports = async ({ options }) => pluginsFor(options.stage ?? 'dev');
module.exports.pluginsFor = pluginsFor;
module.exports.LOCAL_STAGE = LOCAL_STAGE;
module.exports.LOCAL_STAGE_PLUGIN = LOCAL_STAGE_PLUGIN;
