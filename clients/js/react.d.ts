// Type declarations for presence-client/react (react.js; keep in step with it:
// test/react-types-usage.tsx is type-checked against this file, and
// test/types.test.js compares its exports with the module's).

import type * as React from "react";
import PresenceClient = require("./presence-client");

export interface PresenceProviderProps {
  /** The client the hooks below use; the app connects it (and closes it). */
  client: PresenceClient;
  children?: React.ReactNode;
}

/** Makes `client` the one the hooks below it use. */
export declare function PresenceProvider(props: PresenceProviderProps): React.ReactElement;

/** The PresenceClient of the nearest PresenceProvider. */
export declare function usePresenceClient(): PresenceClient;

/** The records of `users`, in that order (null until the first snapshot), kept live while used;
 * re-renders only when one of them changes. */
export declare function usePresence(users: string | readonly string[]): readonly (PresenceClient.PresenceRecord | null)[];

export interface Self {
  /** This user (null until hello names it, with token auth). */
  user: string | null;
  /** This user's own record (status and text as set, `invisible` included), or null until known. */
  record: PresenceClient.PresenceRecord | null;
  /** client.idle: this device has had no activity for autoAway's idleMs (false without autoAway). */
  idle: boolean;
  /** client.setStatus: the record follows once the server answers. */
  setStatus: PresenceClient["setStatus"];
}

/** This user's own record, this device's idleness and setStatus. */
export declare function useSelf(): Self;

export interface UseRoomOptions {
  /** This device's state: joined with it, and sent again (room_state) whenever its JSON changes. */
  state?: PresenceClient.RoomState;
  /** The room token for the join (`--room-policy token`); `false`: the room takes none. */
  token?: string | false;
  /** A room token for this room from the app's backend (asked as the client's getToken is). */
  getToken?: PresenceClient.GetToken;
  /** Every signal of the others (no re-render). */
  onSignal?: (e: PresenceClient.RoomSignalEvent) => void;
}

/** A room as the hooks show it: an immutable snapshot, replaced on each change. */
export interface RoomSnapshot {
  /** User -> devices; null in a large room (counts only) and before the first room frame. */
  readonly members: ReadonlyMap<string, readonly Readonly<PresenceClient.RoomDevice>[]> | null;
  /** User and device counts: of the member list when there is one, else of the last room or occupancy frame. */
  readonly users: number;
  readonly devices: number;
  /** The users typing now (never this one), sorted. */
  readonly typingUsers: readonly string[];
  /** True from the room frame answering the join until a leave, a refusal or a dropped connection. */
  readonly joined: boolean;
  /** The last error about the room, or null. */
  readonly error: PresenceClient.PresenceError | null;
}

export interface RoomHandle extends RoomSnapshot {
  /** Replaces this device's state: the others get room_update. */
  update(state: PresenceClient.RoomState): void;
  /** Relays any JSON (at most 1,024 bytes) to the room's other devices. */
  signal(data: unknown): void;
  /** Call on each keystroke: sends `{typing: true}` at most every 2 s. */
  typing(): void;
  /** Stopped typing: sends `{typing: false}`. */
  stopTyping(): void;
}

/** Joins room `id` on mount (one join shared by the components in it) and leaves on unmount. */
export declare function useRoom(id: string, options?: UseRoomOptions): RoomHandle;

/** The counts of room `id`, which it joins like useRoom; re-renders only when they change. */
export declare function useOccupancy(id: string): Readonly<PresenceClient.Occupancy>;
