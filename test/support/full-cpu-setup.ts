/** Setup file of the chaos tier in a merged run: it must not have inherited a yielding priority (cpu-priority.ts). */
import { assertFullCpuPriority } from './cpu-priority.ts';

assertFullCpuPriority();
