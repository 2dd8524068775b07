// Type declarations for presence-client.js (keep in step with it: the
// browser test type-checks tests/browser/types-usage.ts against this file).

declare class PresenceClient {
  constructor(options: PresenceClient.Options);
  /** The statuses setStatus accepts. */
  static readonly STATUSES: readonly PresenceClient.ChosenStatus[];
  /** Close codes after which the client stops reconnecting (and 4401 without refreshToken). */
  static readonly FINAL_CLOSE_CODES: readonly number[];
  /** The class of the objects join() returns. */
  static readonly Room: new (client: PresenceClient, id: string, state?: PresenceClient.RoomState, token?: string | false) => PresenceClient.Room;

  /** Endpoints tried in turn on reconnects. */
  urls: string[];
  /** The endpoint of the current (or last) connection. */
  url: string;
  user: string | null;
  token: string | null;
  /** Asked for a fresh token (options.refreshToken). */
  refreshToken: (() => string | Promise<string>) | null;
  device: string;
  /** The device's kind, sent as `&kind=` (null: the server's default, "other"). */
  kind: PresenceClient.DeviceKind | null;
  minBackoffMs: number;
  maxBackoffMs: number;
  /** Room tokens from the app's backend (options.getToken). */
  getToken: PresenceClient.GetToken | null;
  /** Shortest time between two room_state frames of one room, ms (the latest state wins). */
  roomStateIntervalMs: number;
  /** Joins answered `unavailable` tried again in a row before the room is given up (options.maxJoinRetries). */
  maxJoinRetries: number;
  /** The WebSocket class in use. */
  WebSocket: new (url: string, protocols?: string | string[]) => WebSocket;
  /** Users watched; re-sent after every reconnect. */
  readonly watched: Set<string>;
  /** Of those, the ones watched with `{devices: true}`. */
  readonly watchedDevices: Set<string>;
  /** The user's status, text and end: this client's choice, re-sent after every reconnect (until
   * its end), or until it makes one the status the server holds for the user (hello's `self`). */
  status: { status: PresenceClient.ChosenStatus; text: string | null; until?: number } | null;
  state: PresenceClient.ConnectionState;
  /** The last hello frame. */
  hello: PresenceClient.Hello | null;
  /** Reconnect attempts since the last hello. */
  attempt: number;
  /** True when frames can be sent now. */
  readonly connected: boolean;
  /** Room id -> Room, for the rooms this client is in (joined again after every reconnect). */
  readonly rooms: Map<string, PresenceClient.Room>;
  /** With autoAway: true while this device has had no activity for `idleMs`. */
  readonly idle: boolean;

  onHello: (hello: PresenceClient.Hello) => void;
  onSnapshot: (records: PresenceClient.PresenceRecord[]) => void;
  /** A watched user's transition; never this user's own record (that is onSelf). */
  onChange: (record: PresenceClient.PresenceRecord) => void;
  /** This user's own record: the answer to setStatus, and a change made on another of its devices. */
  onSelf: (record: PresenceClient.PresenceRecord) => void;
  onState: (state: PresenceClient.ConnectionState, info: PresenceClient.StateInfo) => void;
  onError: (error: PresenceClient.PresenceError) => void;
  onAuthExpiring: (info: { in_ms: number }) => void;
  /** With autoAway: this device turned idle (true), or is active again (false). */
  onIdle: (idle: boolean) => void;

  /** Opens the connection and keeps it open until close(). */
  connect(): void;
  /** Closes for good. */
  close(): void;
  /**
   * Steps away without leaving (an app going to the background): the server keeps the device
   * present, and in its rooms, for a grace it bounds (`--pause-grace-ms`; at most `graceMs`), the
   * socket closes and nothing reconnects until resume(). Resolves with the grace granted in ms
   * (0 when nothing was kept).
   */
  pause(options?: { graceMs?: number }): Promise<number>;
  /** Comes back after pause(): a resume within the grace shows the others nothing. */
  resume(): void;
  /**
   * Turns automatic away on (`true`: the defaults), changes its settings (counting from now), or
   * turns it off (`false`: a standing idle away goes back to the choice at once). See
   * `Options.autoAway`.
   */
  setAutoAway(options: boolean | PresenceClient.AutoAway): void;
  /** Watches users: onSnapshot, then onChange for each transition; with
   * `{devices: true}` also for each change of their device count. */
  watch(users: string | string[], options?: { devices?: boolean }): void;
  unwatch(users: string | string[]): void;
  /** Re-reads every watched user (device counts). */
  refresh(): void;
  /** Sets the status of all of this user's devices: with text, or with
   * `{text, until}` (epoch ms or a Date: back to "online" then). */
  setStatus(
    status: PresenceClient.ChosenStatus,
    options?: string | null | { text?: string | null; until?: number | Date | null },
  ): void;
  /** Refreshes the lease explicitly. */
  heartbeat(): void;
  /** Joins a room now, or once connected, and again after every reconnect with its last state.
   * Joining a room this client is in already replaces the state and returns the same Room.
   * `token`: the room token (`--room-policy token`); without one, getToken is asked;
   * `false`: the room takes no token. */
  join(room: string, options?: PresenceClient.JoinOptions): PresenceClient.Room;
}

declare namespace PresenceClient {
  /** A status a client may choose; `invisible` shows `offline` to everyone else. */
  export type ChosenStatus = "online" | "away" | "busy" | "invisible";

  /** The kind of a device (`kind` option; records list them as `kinds`). */
  export type DeviceKind = "web" | "desktop" | "mobile" | "tablet" | "bot" | "other";

  /** A status as others see it (`invisible` only in a user's own record). */
  export type Status = "online" | "away" | "busy" | "offline" | "invisible";

  /** One user's presence, as in `snapshot` and `presence` frames. */
  export interface PresenceRecord {
    user: string;
    status: Status;
    /** Live devices (0 when offline or hidden). */
    devices: number;
    /** Epoch ms of the last activity, or null when unknown or hidden. */
    last_seen: number | null;
    /** Status text, or null. */
    text: string | null;
    /** When the status ends (back to online), epoch ms; null when it does not or is hidden. */
    until?: number | null;
    /** Sorted distinct kinds of the live devices (empty when offline or hidden). */
    kinds?: DeviceKind[];
    /**
     * `true` while every live device of the user is paused (`pause()`: apps
     * in the background), absent otherwise; the status stays the chosen one.
     * Not the same as `client.idle`, this device's own auto-away idleness.
     */
    idle?: boolean;
    /** Newer servers may add fields. */
    [field: string]: unknown;
  }

  /** The `hello` frame sent once a connection is accepted. */
  export interface Hello {
    type: "hello";
    user: string;
    device: string;
    heartbeat_ms: number;
    ttl_ms: number;
    /** The user's own record (`invisible` as it is); null when the server could not read it. */
    self: PresenceRecord | null;
    [field: string]: unknown;
  }

  /** An error: a server `error` frame, or `code: "client"` for the client's own. */
  export interface PresenceError {
    /** `forbidden`, `removed`, `token_expired`, `unavailable`, `room_full`, `invalid_status`,
     * `client` (the client's own: getToken failed, ...) and the others of the protocol. */
    code: string;
    message: string;
    /** With `invalid_status`: the refused choice. */
    status?: ChosenStatus;
    /** The room the error is about (forbidden, removed, token_expired, room_full, not_in_room, unavailable, ...). */
    room?: string;
    /** On an error that put a room out: true when the client joins it again by itself
     * (`unavailable` within maxJoinRetries, the one rejoin after `token_expired`, `not_in_room`),
     * false when the room is over (dropped from `client.rooms`). */
    willRetry?: boolean;
  }

  /** The answer of getToken for a room: a room token, or false when the room takes none. */
  export type GetToken = (room: string) => string | false | Promise<string | false>;

  /** What join() takes. */
  export interface JoinOptions {
    /** This device's state in the room (default `{}`). */
    state?: RoomState;
    /** The room token for this join (`--room-policy token`); `false`: the room takes none. */
    token?: string | false;
  }

  /** A device's state in a room: a small JSON object. */
  export type RoomState = { [key: string]: unknown };

  /** One device of a room member. */
  export interface RoomDevice {
    device: string;
    state: RoomState;
    /** Epoch ms (for devices that joined after the last room frame: when this client heard of it). */
    joined_at: number;
  }

  export interface RoomJoinEvent { user: string; device: string; state: RoomState; first: boolean }
  /** `removed`: the app's backend removed the user from the room. */
  export interface RoomLeaveEvent { user: string; device: string; last: boolean; removed?: boolean }
  export interface RoomUpdateEvent { user: string; device: string; state: RoomState }
  export interface RoomSignalEvent { user: string; device: string; data: unknown }
  export interface Occupancy { users: number; devices: number }

  /** A room this client is in, returned by join(). */
  export interface Room {
    /** The room id, e.g. "doc:42". */
    readonly id: string;
    /** This device's state in the room (the last one it set). */
    state: RoomState;
    /** Counts, as in the last room or occupancy frame. */
    users: number;
    devices: number;
    /** User -> devices, kept current from the room events; null in a large room (and before the first room frame). */
    members: Map<string, RoomDevice[]> | null;
    /** True from the room frame answering the join until a leave, a refusal, a removal, an expired
     * room token or a dropped connection. */
    joined: boolean;
    /** The last error about this room, or null. */
    error: PresenceError | null;
    /** The users typing now (never this one), sorted. */
    typingUsers: string[];
    /** A room frame arrived: the first join, and every rejoin. */
    onSync: (room: Room) => void;
    onJoin: (e: RoomJoinEvent) => void;
    onLeave: (e: RoomLeaveEvent) => void;
    /** One member device's new state (each update of a batch too). */
    onUpdate: (e: RoomUpdateEvent) => void;
    /** Every state change of one server tick at once (after onUpdate for each): the
     * others' latest, e.g. to redraw every cursor once per tick. */
    onUpdates: (updates: RoomUpdateEvent[]) => void;
    onSignal: (e: RoomSignalEvent) => void;
    onOccupancy: (counts: Occupancy) => void;
    /** The users typing now (not yourself), sorted. */
    onTyping: (users: string[]) => void;
    /** An error about this room (client.onError gets it too): `error.willRetry` false when the
     * room is over (forbidden, removed, a refused join, retries spent, getToken failed). */
    onError: (error: PresenceError) => void;
    /** Replaces this device's state: the others get onUpdate. Call it as often as you like
     * (every mouse move): at most one room_state goes per `roomStateIntervalMs`, the latest. */
    update(state: RoomState): void;
    /** Relays any JSON (at most 1,024 bytes) to the room's other devices. */
    signal(data: unknown): void;
    /** Call on each keystroke: sends `{typing: true}` at most every 2 s. */
    typing(): void;
    /** Sends `{typing: false}`. */
    stopTyping(): void;
    /** Leaves: the others get onLeave; not joined again. */
    leave(): void;
  }

  export type ConnectionState = "idle" | "connecting" | "open" | "reconnecting" | "paused" | "closed";

  /** What onState receives with each state. */
  export interface StateInfo {
    /** The WebSocket close code (1006: dropped or refused, 1008: policy, 4401: token expired...). */
    code?: number;
    reason?: string;
    /** False when the client gave up: close(), a malformed URL, or a close that retrying cannot
     * fix (1008: a refused token or another policy; 4001; 4401 without refreshToken). `code`
     * and `reason` then say why. */
    willRetry?: boolean;
    delayMs?: number;
    attempt?: number;
    url?: string;
    hello?: Hello;
    /** With "paused": how long the server keeps the device, in ms (0: nothing kept). */
    graceMs?: number;
  }

  /** Automatic away after a time without activity on this device (`Options.autoAway`). */
  export interface AutoAway {
    /** How long without activity makes this device idle, ms (default 300000: 5 minutes). */
    idleMs?: number;
    /** Where a page coming back into view (`visibilitychange`) counts as activity; default the global. */
    document?: EventTarget & { hidden: boolean };
    /** Where pointer, mouse, key, touch, wheel and focus events count as activity (default the
     * global; without a window, the document). */
    window?: EventTarget;
  }

  export interface Options {
    /** WebSocket endpoint(s), e.g. "wss://example.com/ws"; with several, reconnects try the next. */
    url: string | string[];
    /** This device's id, stable across reconnects. */
    device: string;
    /** This device's kind (default: the server's, "other"). */
    kind?: DeviceKind;
    /** User id (development auth). One of `user` and `token` is required. */
    user?: string;
    /** A JWT, sent as the first frame. */
    token?: string;
    /**
     * In a browser: pause() once the page has been hidden for `delayMs` (default 5000) or on
     * `pagehide`, and resume() when it is visible again (only what it paused itself).
     * `document` and `window` default to the globals.
     */
    autoPause?: boolean | { delayMs?: number; document?: EventTarget & { hidden: boolean }; window?: EventTarget };
    /**
     * Automatic away: after `idleMs` without activity on this device, while the user's chosen
     * status is `online`, the user shows `away` (with the chosen text); the next activity sends
     * the choice back. Never over a status chosen by hand (busy, invisible, away), never as the
     * choice (`status` keeps it, a reconnect does not re-send the away as one), and not again
     * over a status another device set meanwhile. Does nothing without a `window` or `document`
     * (Node, unless given stand-ins). `idle` and `onIdle` tell this device's idleness.
     */
    autoAway?: boolean | AutoAway;
    /** Returns a fresh JWT when the current one expires soon or expired (4401). */
    refreshToken?: () => string | Promise<string>;
    /** Returns a room token (`--room-policy token`) for `room`, or false when the room takes
     * none: asked for a first join given no token, on `room_token_expiring` (sent as
     * `room_token`), for every rejoin after a reconnect, and once after `token_expired`. A throw
     * or no token: the join is not sent, the room is over, onError gets a `client` error. */
    getToken?: GetToken;
    /** Shortest time between two room_state frames of one room, ms (default 50: 20 a second, the
     * server's default --room-state-hz); the latest state wins, and the last one always goes. */
    roomStateIntervalMs?: number;
    /** Joins answered `unavailable` tried again in a row, with backoff, before the room is given
     * up (default 6: about 15 to 30 s of waiting with the default backoff). */
    maxJoinRetries?: number;
    /** First reconnect delay bound, ms (default 500). */
    minBackoffMs?: number;
    /** Largest reconnect delay, ms (default 15000). */
    maxBackoffMs?: number;
    /** WebSocket class (default: the global one; in Node 20, the `ws` package if installed). */
    WebSocket?: new (url: string, protocols?: string | string[]) => WebSocket;
    onHello?: (hello: Hello) => void;
    onSnapshot?: (records: PresenceRecord[]) => void;
    onChange?: (record: PresenceRecord) => void;
    onSelf?: (record: PresenceRecord) => void;
    onState?: (state: ConnectionState, info: StateInfo) => void;
    onError?: (error: PresenceError) => void;
    onAuthExpiring?: (info: { in_ms: number }) => void;
    onIdle?: (idle: boolean) => void;
  }
}

export = PresenceClient;

declare global {
  interface Window {
    PresenceClient: typeof PresenceClient;
  }
}
