// Responses API chains through the proxy with the official Node SDK, as a Node agent runs
// them: `node node_chains.cjs BASE_URL CHAINS TURNS PARALLEL`, with NODE_PATH naming
// the node_modules that hold `openai`. Chains run PARALLEL at a time, each turn naming the
// answer before it; prints {"turns": N} once every turn is answered.
const OpenAI = require("openai");

const [base, chains, turns, parallel] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: "sk-client", maxRetries: 0 });

async function chain(number) {
  let previous;
  for (let turn = 1; turn <= Number(turns); turn++) {
    const answer = await client.responses.create({
      model: "gpt-4o-mini",
      input: `Chain ${number}: what about step ${turn}?`,
      max_output_tokens: 32,
      ...(previous ? { previous_response_id: previous } : {}),
    });
    if (!answer.output_text) throw new Error(`chain ${number} turn ${turn}: no text`);
    previous = answer.id;
  }
}

async function main() {
  for (let first = 0; first < Number(chains); first += Number(parallel)) {
    const batch = [];
    for (let n = first; n < Math.min(first + Number(parallel), Number(chains)); n++) {
      batch.push(chain(n));
    }
    await Promise.all(batch);
  }
  console.log(JSON.stringify({ turns: Number(chains) * Number(turns) }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
