// The ES module entry of presence-client/react: the same hooks as react.js
// (one source, so that CommonJS and ESM importers share one store per client).
import hooks from "./react.js";

export const { PresenceProvider, usePresenceClient, usePresence, useSelf, useRoom, useOccupancy } = hooks;
