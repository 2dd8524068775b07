// The ES module entry of the package: the same client as presence-client.js
// (one source, which is also what every presence-server node serves at
// /presence-client.js), as the default export and as a named one.
import PresenceClient from "./presence-client.js";

export default PresenceClient;
export { PresenceClient };
