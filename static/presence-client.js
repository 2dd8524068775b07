// presence-client.js: a small client for presence-server.
//
//   const client = new PresenceClient({ url: "ws://host:8080/ws", user: "alice", device: "tab-1" });
//   client.onSnapshot = (records) => ...;   // answer to watch()
//   client.onChange = (record) => ...;      // live transition of a watched user
//   client.onState = (state) => ...;        // "connecting" | "open" | "closed"
//   client.onError = (frame) => ...;        // {code, message} error frames
//   client.connect();
//   client.watch(["bob", "carol"]);
//   client.setStatus("away", "in a meeting");
//
// It reconnects with exponential backoff (with jitter) and re-sends the
// watch list and the chosen status after each reconnect.
(function (global) {
  "use strict";

  class PresenceClient {
    constructor({ url, user, device, token, minBackoffMs = 500, maxBackoffMs = 15000 }) {
      this.url = url;
      this.user = user;
      this.device = device;
      this.token = token;
      this.minBackoffMs = minBackoffMs;
      this.maxBackoffMs = maxBackoffMs;
      this.watched = new Set();
      this.status = null;
      this.backoff = minBackoffMs;
      this.ws = null;
      this.stopped = false;
      this.onSnapshot = () => {};
      this.onChange = () => {};
      this.onState = () => {};
      this.onError = () => {};
      this.onHello = () => {};
    }

    connect() {
      this.stopped = false;
      const params = new URLSearchParams({ device: this.device });
      if (this.token) params.set("token", this.token);
      else params.set("user", this.user);
      const ws = new WebSocket(`${this.url}?${params}`);
      this.ws = ws;
      this.onState("connecting");
      ws.onmessage = (ev) => this._frame(JSON.parse(ev.data));
      ws.onclose = (ev) => {
        if (this.ws !== ws) return;
        this.onState("closed", ev);
        if (this.stopped) return;
        const delay = this.backoff * (0.5 + Math.random());
        this.backoff = Math.min(this.backoff * 2, this.maxBackoffMs);
        setTimeout(() => this.connect(), delay);
      };
    }

    close() {
      this.stopped = true;
      if (this.ws) this.ws.close(1000, "bye");
    }

    watch(users) {
      users.forEach((u) => this.watched.add(u));
      this._send({ type: "watch", users });
    }

    unwatch(users) {
      users.forEach((u) => this.watched.delete(u));
      this._send({ type: "unwatch", users });
    }

    setStatus(status, text) {
      this.status = { status, text: text || null };
      this._send({ type: "status", status, text: text || null });
    }

    heartbeat() {
      this._send({ type: "heartbeat" });
    }

    _send(frame) {
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(frame));
    }

    _frame(f) {
      switch (f.type) {
        case "hello":
          this.backoff = this.minBackoffMs;
          this.onState("open");
          this.onHello(f);
          if (this.status) this._send({ type: "status", ...this.status });
          if (this.watched.size) this._send({ type: "watch", users: [...this.watched] });
          break;
        case "snapshot":
          this.onSnapshot(f.presence);
          break;
        case "presence": {
          const { type, ...record } = f;
          this.onChange(record);
          break;
        }
        case "error":
          this.onError(f);
          break;
      }
    }
  }

  global.PresenceClient = PresenceClient;
})(typeof window !== "undefined" ? window : globalThis);
