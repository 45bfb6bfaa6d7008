// Polar's reference agent: the smallest real agent loop, for the `shell` harness's doctor run and as an example.
// Node >= 18, no dependencies. OpenAI Chat Completions at $OPENAI_BASE_URL with one tool, bash{command}; the task is
// read from the file $POLAR_INSTRUCTION_FILE (never from a command line). Tool commands run via `bash -c`, in the
// current directory. Prints the final answer; exits 1 with the server's error on stderr when a call fails.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";

const base = process.env.OPENAI_BASE_URL;
const key = process.env.OPENAI_API_KEY;
const model = process.env.POLAR_MODEL;
const task = readFileSync(process.env.POLAR_INSTRUCTION_FILE, "utf8");
const tools = [{
  type: "function",
  function: {
    name: "bash",
    description: "Run a bash command in the working directory and return its output.",
    parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
  },
}];
const messages = [
  { role: "system", content: "You are a coding agent. Use the bash tool to act, then answer briefly." },
  { role: "user", content: task },
];

for (let turn = 0; turn < 50; turn++) {
  const response = await fetch(`${base}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, messages, tools }),
  });
  const text = await response.text();
  if (!response.ok) {
    process.stderr.write(`model call failed: HTTP ${response.status}: ${text}\n`);
    process.exit(1);
  }
  const message = JSON.parse(text).choices[0].message;
  messages.push(message);
  if (!message.tool_calls || message.tool_calls.length === 0) {
    process.stdout.write(`${message.content ?? ""}\n`);
    process.exit(0);
  }
  for (const call of message.tool_calls) {
    let output;
    try {
      const { command } = JSON.parse(call.function.arguments);
      const run = spawnSync("bash", ["-c", command], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
      output = `${run.stdout}${run.stderr}[exit ${run.status}]`;
    } catch (error) {
      output = `error: ${error}`;
    }
    messages.push({ role: "tool", tool_call_id: call.id, content: output });
  }
}
process.stderr.write("gave up after 50 turns\n");
process.exit(1);
