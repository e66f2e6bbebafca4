// Builds the UI into dist/, which the coordinator serves at / (index.html) and /ui (assets).
import { defineConfig } from "vite";

export default defineConfig({
  base: "/ui/",
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false, chunkSizeWarningLimit: 200 },
  server: { proxy: { "/api": "http://127.0.0.1:8321" } },
});
