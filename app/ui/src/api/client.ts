// The typed API client: openapi-fetch over the types generated from openapi.yaml (npm run gen), plus auth and errors.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema";

export type Schemas = components["schemas"];
export type Job = Schemas["Job"];
export type JobPage = Schemas["JobPage"];
export type Checkpoint = Schemas["Checkpoint"];
export type CheckpointPage = Schemas["CheckpointPage"];
export type CheckpointDetail = Schemas["CheckpointDetail"];
export type CheckpointStatistics = Schemas["CheckpointStatistics"];
export type SubtaskStats = Schemas["SubtaskStats"];
export type ChannelStateManifest = Schemas["ChannelStateManifest"];
export type ChannelSegment = Schemas["ChannelSegment"];
export type SegmentPreview = Schemas["SegmentPreview"];
export type OvertakeEvent = Schemas["Event"];
export type Graph = Schemas["Graph"];
export type AttemptInfo = Schemas["AttemptInfo"];
export type JobLiveMetrics = Schemas["JobLiveMetrics"];
export type VertexLiveMetrics = Schemas["VertexLiveMetrics"];
export type SubtaskLiveMetrics = Schemas["SubtaskLiveMetrics"];
export type VertexCheckpointSummary = Schemas["VertexCheckpointSummary"];
export type MinMaxAvg = Schemas["MinMaxAvg"];
export type SubtaskModes = Schemas["SubtaskModes"];

/** Job statuses in which the job runs and takes checkpoints. */
export const ACTIVE_STATUSES = ["CREATED", "RUNNING", "FAILING"];

/** Abort reasons that are not failures: the job ended or a new attempt started, or a newer checkpoint completed. */
export const INTERRUPTED_REASONS = ["subsumed", "new_attempt", "job_cancelled", "job_ended"];

export function interrupted(c: Checkpoint): boolean {
  return c.status === "ABORTED" && !!c.abort_reason && INTERRUPTED_REASONS.includes(c.abort_reason);
}

const TOKEN_KEY = "overtake.token";

export function getToken(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token: string | null): void {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An error a page can show: status 0 means the coordinator could not be reached. */
export class ApiError extends Error {
  constructor(
    public status: number,
    public code: string,
    message: string,
  ) {
    super(message);
  }
}

export const api = createClient<paths>({ baseUrl: "" });
api.use({
  onRequest({ request }) {
    const token = getToken();
    if (token) request.headers.set("Authorization", `Bearer ${token}`);
    // Marks the UI's own requests: a page of another origin cannot send this header (CORS), so the coordinator
    // accepts state-changing requests that carry it even without a token.
    request.headers.set("X-Overtake-Client", "ui");
    return request;
  },
});

type Result<T> = { data?: T; error?: unknown; response: Response };

/** Await an openapi-fetch call and return its body, or throw an ApiError with the server's message. */
export async function call<T>(request: Promise<Result<T>>): Promise<T> {
  let result: Result<T>;
  try {
    result = await request;
  } catch (e) {
    throw new ApiError(0, "unreachable", `Cannot reach the coordinator at ${location.origin} (${String(e)}).`);
  }
  if (result.response.ok && result.data !== undefined) return result.data;
  const body = result.error as Schemas["ErrorResponse"] | undefined;
  const status = result.response.status;
  const message = body?.error?.message ?? `the coordinator answered ${status} ${result.response.statusText}`;
  throw new ApiError(status, body?.error?.code ?? "http_error", message);
}

export const EVENTS_PATH: keyof paths = "/api/v1/jobs/{job_id}/events";
