// The Overtake UI: a hash router over the four pages (jobs, job, checkpoint, in-flight data).
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { Link } from "./components/common";
import { CheckpointPage } from "./pages/Checkpoint";
import { InFlightPage } from "./pages/InFlight";
import { JobPage } from "./pages/Job";
import { JobsPage } from "./pages/Jobs";
import "./style.css";

function route(hash: string) {
  const path = hash.replace(/^#/, "") || "/";
  let m: RegExpMatchArray | null;
  if ((m = path.match(/^\/jobs\/(\d+)\/checkpoints\/(\d+)\/in-flight$/)))
    return <InFlightPage jobId={Number(m[1])} cpId={Number(m[2])} key={path} />;
  if ((m = path.match(/^\/jobs\/(\d+)\/checkpoints\/(\d+)$/)))
    return <CheckpointPage jobId={Number(m[1])} cpId={Number(m[2])} key={path} />;
  if ((m = path.match(/^\/jobs\/(\d+)$/))) return <JobPage jobId={Number(m[1])} key={path} />;
  if (path === "/" || path === "/jobs") return <JobsPage />;
  return (
    <div class="empty">
      <h2>No such page</h2>
      <p>
        <Link href="/">See all jobs</Link>
      </p>
    </div>
  );
}

function App() {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = () => {
      setHash(location.hash);
      window.scrollTo(0, 0);
    };
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return (
    <>
      <nav class="top">
        <a href="#/" class="brand">
          Overtake
        </a>
        <span class="muted">unaligned checkpoints</span>
        <span class="spacer" />
        <a href="#/">Jobs</a>
        <a href="/docs">API</a>
      </nav>
      <main>{route(hash)}</main>
    </>
  );
}

render(<App />, document.getElementById("app")!);
