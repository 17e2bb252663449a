/** Setup file of the tiers that yield the CPU to the chaos tier in a merged run (cpu-priority.ts). */
import { yieldCpu } from './cpu-priority.ts';

yieldCpu();
