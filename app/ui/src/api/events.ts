// Follows a job's server-sent events with fetch (so the Authorization header can be sent), resuming with Last-Event-ID.
// The stream is parsed by eventsource-parser (every field of the SSE format: id, event, data, retry, comments).
import { createParser, type EventSourceMessage } from "eventsource-parser";
import { EVENTS_PATH, getToken, type OvertakeEvent } from "./client";

export type StreamState = "connecting" | "live" | "reconnecting" | "unauthorized" | "gone";

/** Follow the events after `after` (an event id; later reconnects resume from the last event seen). */
export function followEvents(
  jobId: number,
  after: number,
  onEvent: (e: OvertakeEvent) => void,
  onState: (s: StreamState) => void,
): () => void {
  const controller = new AbortController();
  let lastId: string | null = null;
  let delay = 500;

  async function once(): Promise<"retry" | "stop"> {
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    if (lastId) headers["Last-Event-ID"] = lastId;
    const url = EVENTS_PATH.replace("{job_id}", String(jobId)) + (lastId ? "" : `?after=${after}`);
    const response = await fetch(url, { headers, signal: controller.signal, cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      onState("unauthorized");
      return "stop";
    }
    if (response.status === 404) {
      onState("gone");
      return "stop";
    }
    if (!response.ok || !response.body) return "retry";
    onState("live");
    delay = 500;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let retry: number | null = null; // the server's "retry:" field: the reconnection delay it asks for
    const parser = createParser({
      onEvent(message: EventSourceMessage) {
        if (message.id) lastId = message.id;
        if (!message.data) return;
        try {
          onEvent(JSON.parse(message.data) as OvertakeEvent);
        } catch {
          /* a malformed event is skipped */
        }
      },
      onRetry(ms: number) {
        retry = ms;
      },
    });
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        if (retry !== null) delay = retry;
        return "retry";
      }
      parser.feed(value);
    }
  }

  (async () => {
    onState("connecting");
    while (!controller.signal.aborted) {
      let outcome: "retry" | "stop" = "retry";
      try {
        outcome = await once();
      } catch {
        outcome = "retry";
      }
      if (controller.signal.aborted || outcome === "stop") return;
      onState("reconnecting");
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10_000);
    }
  })();
  return () => controller.abort();
}
