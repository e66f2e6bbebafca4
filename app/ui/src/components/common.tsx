// Shared pieces of the pages: data loading, errors (with the admin-token form), the token dialog, pager, badges.
import type { ComponentChildren } from "preact";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError, getToken, setToken, type SubtaskModes as SubtaskModesCounts } from "../api/client";

export type Loaded<T> = { data: T | null; error: ApiError | null; loading: boolean; reload: () => void };

/** Load data for a page; reload() refetches without clearing what is shown. */
export function useData<T>(load: () => Promise<T>, deps: unknown[]): Loaded<T> {
  const [state, setState] = useState<{ data: T | null; error: ApiError | null; loading: boolean }>({
    data: null,
    error: null,
    loading: true,
  });
  const seq = useRef(0);
  const run = useCallback(() => {
    const mine = ++seq.current;
    setState((s) => ({ ...s, loading: true }));
    load().then(
      (data) => mine === seq.current && setState({ data, error: null, loading: false }),
      (error: unknown) =>
        mine === seq.current &&
        setState((s) => ({
          data: s.data,
          error: error instanceof ApiError ? error : new ApiError(0, "error", String(error)),
          loading: false,
        })),
    );
  }, deps);
  useEffect(run, [run]);
  return { ...state, reload: run };
}

/** The token form shown where the coordinator answered 401 (or 403 for a token that is not the admin's). */
export function TokenForm({ onSaved, error }: { onSaved: () => void; error?: ApiError }) {
  const [value, setValue] = useState("");
  return (
    <form
      class="token-form"
      onSubmit={(e) => {
        e.preventDefault();
        setToken(value.trim() || null);
        onSaved();
      }}
    >
      <p>
        {error?.status === 403
          ? "The token you gave is not allowed here (a job's task token cannot use management routes)."
          : "This coordinator requires authentication."}{" "}
        Enter the admin token (<code>OVERTAKE_ADMIN_TOKEN</code>); it is kept for this browser tab only.
      </p>
      <input
        type="password"
        name="token"
        placeholder="admin token"
        autoComplete="off"
        value={value}
        onInput={(e) => setValue((e.target as HTMLInputElement).value)}
      />
      <button type="submit" class="primary">
        Use token
      </button>
      {getToken() && (
        <button type="button" onClick={() => (setToken(null), onSaved())}>
          Forget token
        </button>
      )}
    </form>
  );
}

export function ErrorView({
  error,
  retry,
  notFound,
}: {
  error: ApiError;
  retry: () => void;
  notFound?: ComponentChildren;
}) {
  if (error.status === 401 || error.status === 403) {
    return (
      <div class="panel error-panel" role="alert">
        <h2>{error.status === 401 ? "Authentication required" : "Not allowed"}</h2>
        <p class="muted">{error.message}</p>
        <TokenForm onSaved={retry} error={error} />
      </div>
    );
  }
  if (error.status === 404 && notFound) {
    return (
      <div class="panel error-panel" role="alert">
        {notFound}
        <p class="muted">{error.message}</p>
      </div>
    );
  }
  const unreachable = error.status === 0;
  return (
    <div class="panel error-panel" role="alert">
      <h2>{unreachable ? "Coordinator unreachable" : `Request failed (${error.status})`}</h2>
      <p>{error.message}</p>
      {unreachable && <p class="muted">Is the coordinator running? This page retries when you ask it to.</p>}
      <button onClick={retry}>Retry</button>
    </div>
  );
}

/** A non-blocking banner for a refresh that failed while older data is still shown. */
export function StaleBanner({ error, retry }: { error: ApiError | null; retry: () => void }) {
  if (!error) return null;
  return (
    <div class="banner" role="alert">
      {error.status === 0 ? "Coordinator unreachable: showing the last data received. " : `${error.message} `}
      <button onClick={retry}>Retry</button>
    </div>
  );
}

export function Pager({
  offset,
  limit,
  total,
  onChange,
  labels = ["« Newest", "‹ Newer", "Older ›", "Oldest »"],
}: {
  offset: number;
  limit: number;
  total: number;
  onChange: (offset: number) => void;
  labels?: [string, string, string, string];
}) {
  if (total <= limit) return null;
  const page = Math.floor(offset / limit) + 1;
  const pages = Math.max(1, Math.ceil(total / limit));
  return (
    <nav class="pager" aria-label="pages">
      <button disabled={page <= 1} onClick={() => onChange(0)}>
        {labels[0]}
      </button>
      <button disabled={page <= 1} onClick={() => onChange(Math.max(0, offset - limit))}>
        {labels[1]}
      </button>
      <span class="page-info">
        Page {page} of {pages} · {total.toLocaleString("en-US")} in all
      </span>
      <button disabled={page >= pages} onClick={() => onChange(offset + limit)}>
        {labels[2]}
      </button>
      <button disabled={page >= pages} onClick={() => onChange((pages - 1) * limit)}>
        {labels[3]}
      </button>
    </nav>
  );
}

export function Status({ value }: { value: string }) {
  return <span class={`badge status-${value.toLowerCase()}`}>{value}</span>;
}

export function TypeBadge({ value }: { value: string }) {
  return (
    <span class={`badge type-${value}`} title="what the coordinator decided for this checkpoint">
      {value}
    </span>
  );
}

/** What the acked subtasks did, beside the type the coordinator decided: "3 unaligned · 1 aligned over budget". */
export function SubtaskModes({ modes }: { modes: SubtaskModesCounts }) {
  const parts: string[] = [];
  if (modes.unaligned) parts.push(`${modes.unaligned} unaligned`);
  if (modes.aligned) parts.push(`${modes.aligned} aligned`);
  if (modes.aligned_over_budget) parts.push(`${modes.aligned_over_budget} aligned over the in-flight budget`);
  return (
    <span class="subtask-modes muted" title="what the acknowledged subtasks did">
      {parts.length ? parts.join(" · ") : "no subtask acknowledged"}
    </span>
  );
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <div class="empty">{children}</div>;
}

/** Ask for the admin token in a dialog; resolves true when one was entered. */
export function askToken(message: string): Promise<boolean> {
  return new Promise((resolve) => {
    const dialog = document.createElement("dialog");
    dialog.className = "token-dialog";
    dialog.innerHTML = `<form method="dialog">
      <h3>Admin token required</h3>
      <p></p>
      <input type="password" name="token" placeholder="admin token" autocomplete="off" required>
      <div class="actions"><button value="cancel" formnovalidate>Cancel</button>
      <button value="ok" class="primary">Use token</button></div></form>`;
    (dialog.querySelector("p") as HTMLElement).textContent = message;
    document.body.appendChild(dialog);
    dialog.addEventListener("close", () => {
      const input = dialog.querySelector("input") as HTMLInputElement;
      const ok = dialog.returnValue === "ok" && input.value.trim() !== "";
      if (ok) setToken(input.value.trim());
      dialog.remove();
      resolve(ok);
    });
    dialog.showModal();
  });
}

export function Link({ href, children, class: cls }: { href: string; children: ComponentChildren; class?: string }) {
  return (
    <a href={`#${href}`} class={cls}>
      {children}
    </a>
  );
}

/** Ask to confirm an action that cannot be undone; resolves true when confirmed. */
/** Ask to confirm an action; `destructive` (it cannot be undone) makes the confirming button red. */
export function confirmAction(
  title: string,
  message: string,
  confirmLabel: string,
  destructive = false,
): Promise<boolean> {
  return new Promise((resolve) => {
    const dialog = document.createElement("dialog");
    dialog.className = "confirm-dialog";
    dialog.innerHTML = `<form method="dialog"><h3></h3><p></p>
      <div class="actions"><button value="cancel">Keep running</button>
      <button value="ok" class="primary${destructive ? " destructive" : ""}"></button></div></form>`;
    (dialog.querySelector("h3") as HTMLElement).textContent = title;
    (dialog.querySelector("p") as HTMLElement).textContent = message;
    (dialog.querySelector("button[value=ok]") as HTMLElement).textContent = confirmLabel;
    document.body.appendChild(dialog);
    dialog.addEventListener("close", () => {
      const ok = dialog.returnValue === "ok";
      dialog.remove();
      resolve(ok);
    });
    dialog.showModal();
  });
}
