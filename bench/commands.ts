import { int, sandbox } from 'abx-sandbox';

/** The trivial commands the benchmarks call: the work is nothing, the cost is the path. */
@sandbox('bench')
export class BenchCommands {
  @sandbox.register({ description: 'Add two numbers' })
  add(@int x: number, @int y: number = 2): number {
    return x + y;
  }
}
