/**
 * Sets these variables in the process environment, where the AWS SDK reads its endpoint override,
 * region and credentials, and returns what puts the previous values (or their absence) back.
 */
export function overrideProcessEnv(values: Readonly<Record<string, string>>): () => void {
  const saved = Object.keys(values).map((name) => [name, process.env[name]] as const);
  Object.assign(process.env, values);
  return () => {
    for (const [name, value] of saved) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  };
}
