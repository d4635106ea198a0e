// A calculator agent in JavaScript, trained by an agentlightning-lite trainer in Python.
//
// It speaks the trainer's runner protocol (plain HTTP + JSON): claim a rollout, renew its lease
// while it runs, report the result. Each claim comes with a lease token that the heartbeats and
// the result carry in the X-AGL-Lease header (without it the trainer refuses them: another
// runner with the same API key cannot act on this one's rollouts). The policy model is called
// with the stock `openai` package at the rollout's own base URL (so every call is recorded with
// its token ids), and the tool call is an OpenTelemetry span sent by the stock OTLP/HTTP exporter
// to the trainer's /v1/traces, where the `agentlightning.rollout_id` attribute files it under its
// rollout and the `agentlightning.lease` attribute proves the claim.
//
//   AGL_SERVER=http://trainer:8765 AGL_API_KEY=... node agent.mjs
//
// Environment: AGL_SERVER (default http://127.0.0.1:8765), AGL_API_KEY, AGL_WORKER (this runner's
// name), AGL_MAX_ROLLOUTS (stop after that many; default: run until killed).

import OpenAI from "openai";
import { BasicTracerProvider, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";

const SERVER = (process.env.AGL_SERVER || "http://127.0.0.1:8765").replace(/\/$/, "");
const KEY = process.env.AGL_API_KEY || "";
const WORKER = process.env.AGL_WORKER || `js-${process.pid}`;
const MAX_ROLLOUTS = Number(process.env.AGL_MAX_ROLLOUTS || Infinity);
const AUTH = KEY ? { Authorization: `Bearer ${KEY}` } : {};

const exporter = new OTLPTraceExporter({ url: `${SERVER}/v1/traces`, headers: AUTH });
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const tracer = provider.getTracer("agl-js-agent");

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// One call of the runner protocol, retried with backoff while the trainer is unreachable.
async function agl(method, path, body, lease) {
  const headers = { "Content-Type": "application/json", ...AUTH, ...(lease ? { "X-AGL-Lease": lease } : {}) };
  for (let delay = 200; ; delay = Math.min(delay * 2, 5000)) {
    try {
      const res = await fetch(SERVER + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (res.ok) return await res.json();
      if (res.status < 500 && res.status !== 429) {
        throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
      }
    } catch (err) {
      if (!(err instanceof TypeError)) throw err; // TypeError: the network; anything else is fatal
    }
    await sleep(delay);
  }
}

// The tool: a calculator, traced as a GenAI `execute_tool` span of this rollout.
function calculator(llm, a, b) {
  const span = tracer.startSpan("execute_tool calculator", {
    attributes: {
      "agentlightning.rollout_id": llm.rolloutId,
      "agentlightning.lease": llm.lease, // checked by the trainer, never stored
      "gen_ai.operation.name": "execute_tool",
      "gen_ai.tool.name": "calculator",
      "gen_ai.tool.call.arguments": JSON.stringify({ a, b }),
    },
  });
  const result = a + b;
  span.setAttribute("gen_ai.tool.call.result", JSON.stringify(result));
  span.end();
  return result;
}

// The agent: ask the policy, check its answer with the tool, return the reward.
async function agent(task, llm) {
  const client = new OpenAI({ baseURL: llm.baseURL, apiKey: llm.apiKey, maxRetries: 0 });
  const reply = await client.chat.completions.create({
    model: llm.model,
    max_tokens: 16,
    temperature: 1.0,
    messages: [{ role: "user", content: `What is ${task.a} + ${task.b}? Answer with the number.` }],
  });
  const text = reply.choices[0].message.content || "";
  const answer = calculator(llm, task.a, task.b);
  return (text.includes(String(answer)) ? 1.0 : 0.0) + new Set(text).size / 64;
}

async function runOne(ro) {
  const llm = {
    baseURL: SERVER + ro.llm_path, // /rollout/<id>/lease/<token>/v1: the lease rides in the path
    apiKey: KEY || "agl-no-key",
    model: ro.model,
    rolloutId: ro.rollout_id,
    lease: ro.lease,
  };
  const beat = setInterval(
    () =>
      agl("POST", "/agl/v1/heartbeat", { worker: WORKER, rollout_ids: [ro.rollout_id] }, ro.lease).catch(() => {}),
    (ro.lease_timeout * 1000) / 3,
  );
  let result;
  try {
    const reward = await agent(ro.task, llm);
    result = { status: "succeeded", reward };
  } catch (err) {
    result = { status: "failed", error: String(err) };
  } finally {
    clearInterval(beat);
  }
  await provider.forceFlush(); // the spans reach the trainer before the result does
  const path = `/agl/v1/rollouts/${encodeURIComponent(ro.rollout_id)}/complete`;
  const answer = await agl("POST", path, result, ro.lease);
  console.log(`rollout ${ro.rollout_id}: ${result.status} reward=${result.reward} counted=${answer.counted}`);
}

let done = 0;
while (done < MAX_ROLLOUTS) {
  const { rollout } = await agl("POST", "/agl/v1/claim", { worker: WORKER, wait: 5 });
  if (!rollout) continue;
  await runOne(rollout);
  done += 1;
}
await provider.shutdown();
